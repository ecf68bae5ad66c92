"""The run report: per-rank, per-step and run-wide figures and every verdict, computed once into
``results.RunReport`` section by section (``summarize``, ``sections``), which the text report,
``report --json`` and the TUI render."""

from traceview.analysis.summary.assemble import SECTIONS, summarize
from traceview.analysis.summary.notes import _no_peer
from traceview.analysis.summary.parts import cross_rank_of, groups_of
from traceview.analysis.summary.ranks import rank_spread
from traceview.analysis.summary.sections import (
    Context,
    Draft,
    ReportOptions,
    RunInputs,
    Section,
)
from traceview.analysis.summary.steps import (
    SLOW_FACTOR,
    complete_flag,
    incomplete_steps,
    manifest_steps_from,
    named_warmup,
)
from traceview.analysis.summary.verdicts import (
    HIDDEN_NO,
    HIDDEN_YES,
    PIPELINE_BUBBLE_MIN,
    PIPELINE_SLOW_PHASE,
    PIPELINE_SLOW_STAGE,
    STRAGGLER_MIN_WAIT,
    bottleneck_of,
    hidden_verdict,
)

__all__ = [
    "HIDDEN_NO",
    "HIDDEN_YES",
    "PIPELINE_BUBBLE_MIN",
    "PIPELINE_SLOW_PHASE",
    "PIPELINE_SLOW_STAGE",
    "SECTIONS",
    "SLOW_FACTOR",
    "STRAGGLER_MIN_WAIT",
    "Context",
    "Draft",
    "ReportOptions",
    "RunInputs",
    "Section",
    "_no_peer",
    "bottleneck_of",
    "complete_flag",
    "cross_rank_of",
    "groups_of",
    "hidden_verdict",
    "incomplete_steps",
    "manifest_steps_from",
    "named_warmup",
    "rank_spread",
    "summarize",
]
