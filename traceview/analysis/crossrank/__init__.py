"""Across ranks: collective calls matched with their counterparts, and communication split into
waiting for the last rank and transfer."""

from traceview.analysis.crossrank.aggregate import (
    alltoall_ranks,
    collective_rows,
    comm_by_group,
    matched_table,
    step_collectives,
)
from traceview.analysis.crossrank.bandwidth import BUS_FACTOR, bus_bandwidth_gbps
from traceview.analysis.crossrank.clocks import (
    MAX_DRIFT,
    MIN_CLOCK_CALLS,
    MIN_DRIFT_SPAN_NS,
    SYNCHRONIZING,
    ClockFit,
    estimate_clocks,
)
from traceview.analysis.crossrank.driver import CrossRank, cross_rank
from traceview.analysis.crossrank.matching import (
    ISSUED,
    LAUNCH_RATIO,
    POINT_TO_POINT,
    Matched,
    global_peer,
    launch_views,
    match_collectives,
    match_pairs,
)
from traceview.analysis.crossrank.waits import (
    PAIR,
    Arrivals,
    arrivals,
    merged_exposed,
    split_waits,
)

__all__ = [
    "BUS_FACTOR",
    "ISSUED",
    "LAUNCH_RATIO",
    "MAX_DRIFT",
    "MIN_CLOCK_CALLS",
    "MIN_DRIFT_SPAN_NS",
    "PAIR",
    "POINT_TO_POINT",
    "SYNCHRONIZING",
    "Arrivals",
    "ClockFit",
    "CrossRank",
    "Matched",
    "alltoall_ranks",
    "arrivals",
    "bus_bandwidth_gbps",
    "collective_rows",
    "comm_by_group",
    "cross_rank",
    "estimate_clocks",
    "global_peer",
    "launch_views",
    "match_collectives",
    "match_pairs",
    "matched_table",
    "merged_exposed",
    "split_waits",
    "step_collectives",
]
