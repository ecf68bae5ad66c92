"""The helper process of a trace read in two parts (``traceview.chunked``): reads the later part.

    python -m traceview.part_reader PARSER TRACE BOUNDARY RULES.pickle OUT

It ends with the process that started it (Linux), and leaves its rows, survey and the parser's
part in OUT (``chunked.read_later_part``); any failure is its exit status, and the caller then
reads the part itself.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from traceview.ingest import _die_with_parent

    parent = int(argv[5]) if len(argv) > 5 else None
    if parent is not None:
        _die_with_parent(parent)
    import pyarrow as pa

    from traceview.chunked import read_later_part
    from traceview.parsers import parser_named

    pa.set_memory_pool(pa.system_memory_pool())  # as the ingest's own process
    name, path, boundary, rules_file, out = argv[:5]
    with Path(rules_file).open("rb") as fh:
        rules = pickle.load(fh)
    read_later_part(parser_named(name), Path(path), int(boundary), rules, Path(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
