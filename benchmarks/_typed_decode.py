#!/usr/bin/env python3
"""The typed-decode limit of issue 15: a typed msgspec decode of a whole Kineto trace into a
4-column Arrow table (name, ph, ts, dur). No parser can read the file faster in Python; the
chunked ingest's wall time is held against this, measured in the same run.

    python _typed_decode.py TRACE.json[.gz]
"""

from __future__ import annotations

import gzip
import sys
from operator import attrgetter

import msgspec
import pyarrow as pa


class Event(msgspec.Struct, gc=False):
    name: str | None = None
    ph: str | None = None
    ts: float | None = None
    dur: float | None = None


class Trace(msgspec.Struct, gc=False):
    traceEvents: list[Event]  # the format's name


def main(path: str) -> int:
    with open(path, "rb") as fh:
        data = fh.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    events = msgspec.json.decode(data, type=Trace).traceEvents
    del data
    table = pa.table(
        {
            "name": pa.array(list(map(attrgetter("name"), events)), pa.string()),
            "ph": pa.array(list(map(attrgetter("ph"), events)), pa.string()),
            "ts": pa.array(list(map(attrgetter("ts"), events)), pa.float64()),
            "dur": pa.array(list(map(attrgetter("dur"), events)), pa.float64()),
        }
    )
    print(table.num_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
