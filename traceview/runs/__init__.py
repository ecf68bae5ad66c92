"""Runs as commands read them: opening what the user points at (traces or a run directory) as a
run, validating and refreshing its cached analysis, labels; above ``ingest`` and ``analysis``."""

from traceview.runs.cache import _TABLE_SCHEMAS, PATH_CACHE, PathFile, RunReplaced
from traceview.runs.handle import Run
from traceview.runs.opening import READ_TRIES, ingest_run, open_run, open_runs
from traceview.runs.reanalysis import reanalyze

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
