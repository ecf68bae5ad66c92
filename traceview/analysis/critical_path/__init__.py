"""Why a step takes as long as it does: its critical path across ranks, blame, and what-if replay
(the graph and its edges: ``graph``; each part in a module of its own, re-exported here)."""

from __future__ import annotations

from traceview.analysis.critical_path.graph import (
    LATE_START,
    NEVER,
    NO_STEP,
    PATH_KINDS,
    TRANSFER,
    Graph,
)
from traceview.analysis.critical_path.replay import Change, Replay, replay
from traceview.analysis.critical_path.report import PATH_VERSION, Explained, PathCache, explain
from traceview.analysis.critical_path.source import _batches, _source, build_graph
from traceview.analysis.critical_path.tables import _stretches, path_stretches, path_table
from traceview.analysis.critical_path.waits import NO_CALL, UNMATCHED_CALL
from traceview.analysis.critical_path.walk import (
    PIECE_COLUMNS,
    PathPiece,
    WalkedPath,
    critical_paths,
)
from traceview.analysis.critical_path.whatif import (
    at_bandwidth,
    balance_rank,
    faster,
    parse_change,
    what_ifs,
)

__all__ = [
    "LATE_START",
    "NEVER",
    "NO_CALL",
    "NO_STEP",
    "PATH_KINDS",
    "PATH_VERSION",
    "PIECE_COLUMNS",
    "TRANSFER",
    "UNMATCHED_CALL",
    "Change",
    "Explained",
    "Graph",
    "PathCache",
    "PathPiece",
    "Replay",
    "WalkedPath",
    "_batches",
    "_source",
    "_stretches",
    "at_bandwidth",
    "balance_rank",
    "build_graph",
    "critical_paths",
    "explain",
    "faster",
    "parse_change",
    "path_stretches",
    "path_table",
    "replay",
    "what_ifs",
]
