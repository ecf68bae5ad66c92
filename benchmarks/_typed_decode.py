#!/usr/bin/env python3
"""The typed-decode reference of issue 31: a typed msgspec decode of a whole Kineto trace into
an Arrow table of the seven columns every analysis needs (name, ph, cat, pid, tid, ts, dur;
pid and tid as int64, a label such as "Spans" folded to a stable negative id as traceview's
parser folds it). ``--fields 4`` reads only name, ph, ts and dur (issue 15's limit, the figure
the older tables in docs/performance.md were held against).

    python _typed_decode.py TRACE.json[.gz] [--fields 4]
"""

from __future__ import annotations

import gzip
import sys
import zlib
from operator import attrgetter
from typing import Any

import msgspec
import pyarrow as pa


class Event(msgspec.Struct, gc=False):
    name: str | None = None
    ph: str | None = None
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None


class Event4(msgspec.Struct, gc=False):
    name: str | None = None
    ph: str | None = None
    ts: float | None = None
    dur: float | None = None


def _label_id(value: Any) -> int | None:
    if value is None or value.__class__ is int:
        return value
    text = str(value).strip()
    text = text[7:] if text.startswith("stream ") else text
    try:
        return int(text, 0) if text.startswith(("0x", "0X")) else int(text)
    except ValueError:
        return -1 - zlib.crc32(str(value).encode())


def _ids(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        mapping = {v: _label_id(v) for v in set(values)}
        return pa.array(list(map(mapping.__getitem__, values)), pa.int64())


def main(path: str, fields: int = 7) -> int:
    with open(path, "rb") as fh:
        data = fh.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    event = Event if fields == 7 else Event4
    trace = msgspec.defstruct("Trace", [("traceEvents", list[event])], gc=False)  # type: ignore[valid-type]
    events = msgspec.json.decode(data, type=trace).traceEvents
    del data
    columns = {
        "name": pa.array(list(map(attrgetter("name"), events)), pa.string()),
        "ph": pa.array(list(map(attrgetter("ph"), events)), pa.string()),
        "ts": pa.array(list(map(attrgetter("ts"), events)), pa.float64()),
        "dur": pa.array(list(map(attrgetter("dur"), events)), pa.float64()),
    }
    if fields == 7:
        columns["cat"] = pa.array(list(map(attrgetter("cat"), events)), pa.string())
        columns["pid"] = _ids(list(map(attrgetter("pid"), events)))
        columns["tid"] = _ids(list(map(attrgetter("tid"), events)))
    print(pa.table(columns).num_rows)
    return 0


if __name__ == "__main__":
    four = "--fields" in sys.argv and sys.argv[sys.argv.index("--fields") + 1] == "4"
    sys.exit(main(sys.argv[1], 4 if four else 7))
