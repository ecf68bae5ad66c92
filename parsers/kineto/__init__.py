"""PyTorch profiler traces (Kineto Chrome-trace JSON, plain or gzip), both generations: the
parser, split by what each module reads (records, columns, communication, memory, the stream)."""

from __future__ import annotations

from traceview.parsers.kineto.columns import ASYNC_LANE
from traceview.parsers.kineto.comm import GROUP_REGION, MAX_GROUPS, MAX_SPLITS, read_pg_config
from traceview.parsers.kineto.memory import MAX_MEMORY_BYTES, MEMORY_RECORD, memory_table
from traceview.parsers.kineto.parser import KinetoParser, KinetoPart, KinetoStream

__all__ = [
    "ASYNC_LANE",
    "GROUP_REGION",
    "MAX_GROUPS",
    "MAX_MEMORY_BYTES",
    "MAX_SPLITS",
    "MEMORY_RECORD",
    "KinetoParser",
    "KinetoPart",
    "KinetoStream",
    "memory_table",
    "read_pg_config",
]
