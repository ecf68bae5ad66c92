"""The per-step breakdown: every instant of a step counted once, by the highest-priority phase
on the rank's critical timeline (the rule: ``attribution.levels``)."""

from traceview.analysis.attribution.intervals import _clip, _union_by_window, merge_intervals
from traceview.analysis.attribution.levels import HOST_BOUND_LEVEL, LEVEL, LEVEL_PHASES, LEVELS
from traceview.analysis.attribution.schedule import (
    CommSchedule,
    comm_schedule,
    layerwise_exposed,
)
from traceview.analysis.attribution.segments import (
    attribution,
    gap_operators,
    operator_gaps,
    timeline_segments,
)
from traceview.analysis.attribution.steps import (
    breakdown,
    comm_intervals,
    covered_by_level,
    level_times,
)
from traceview.analysis.attribution.timeline import (
    DEVICE_WAIT_PATTERN,
    LevelTimes,
    RankTimeline,
    _thread_segments,
    name_mask,
    rank_timeline,
)
from traceview.analysis.attribution.windows import (
    RankPart,
    backward_elsewhere,
    step_windows,
    whole_rank_part,
)

__all__ = [
    "DEVICE_WAIT_PATTERN",
    "HOST_BOUND_LEVEL",
    "LEVEL",
    "LEVELS",
    "LEVEL_PHASES",
    "CommSchedule",
    "LevelTimes",
    "RankPart",
    "RankTimeline",
    "_clip",
    "_thread_segments",
    "_union_by_window",
    "attribution",
    "backward_elsewhere",
    "breakdown",
    "comm_intervals",
    "comm_schedule",
    "covered_by_level",
    "gap_operators",
    "layerwise_exposed",
    "level_times",
    "merge_intervals",
    "name_mask",
    "operator_gaps",
    "rank_timeline",
    "step_windows",
    "timeline_segments",
    "whole_rank_part",
]
