"""Runs as commands read them: opening what the user points at (traces or a run directory) as a
run, validating and refreshing its cached analysis, labels; above ``ingest`` and ``analysis``.
Also a run `collect` is writing (``runs.live``, ``runs.windows``). The names below are imported
when first used, so that ``runs.live`` alone imports neither pyarrow nor polars."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceview.runs.cache import _TABLE_SCHEMAS, PATH_CACHE, PathFile, RunReplaced
    from traceview.runs.handle import Run
    from traceview.runs.opening import READ_TRIES, ingest_run, open_run, open_runs
    from traceview.runs.reanalysis import reanalyze

_WHERE = {
    "PATH_CACHE": "cache",
    "_TABLE_SCHEMAS": "cache",
    "PathFile": "cache",
    "RunReplaced": "cache",
    "Run": "handle",
    "READ_TRIES": "opening",
    "ingest_run": "opening",
    "open_run": "opening",
    "open_runs": "opening",
    "reanalyze": "reanalysis",
}

__all__ = [
    "PATH_CACHE",
    "READ_TRIES",
    "_TABLE_SCHEMAS",
    "PathFile",
    "Run",
    "RunReplaced",
    "ingest_run",
    "open_run",
    "open_runs",
    "reanalyze",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'traceview.runs' has no attribute {name!r}")
    return getattr(import_module(f"traceview.runs.{where}"), name)
