"""What the screens show: one run's report and the lookups the screens need, away from the UI
thread.

This is the TUI's reporter (memray's ``from_snapshot`` step). Every figure and verdict comes
from the analysis (``results.RunReport``); this module only gathers them with the step windows
and thread names the timeline needs, and sorts and filters rows for the tables. Nothing here
imports Textual, numpy or polars.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from traceview.analysis.compare import compare
from traceview.analysis.heatmap import StepMatrix, step_matrix
from traceview.analysis.lanes import windows_by_step
from traceview.model.results import (
    Comparison,
    KernelLaunches,
    RankSummary,
    RankTail,
    RunReport,
    StepStats,
    StepSummary,
    TopOp,
)
from traceview.runs import Run

#: Every operator of the run, not only the report's top ten.
ALL_OPS = 1_000_000


@dataclass
class RunView:
    """Everything the screens of one run show, computed once when the app opens."""

    label: str
    report: RunReport
    windows: dict[int | None, dict[int, tuple[int, int]]]  # step -> rank -> (start, end) ns
    threads: dict[int, dict[str, str]] = field(default_factory=dict)  # rank -> thread names
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host, where the trace says
    matrix: StepMatrix | None = None  # ranks × steps, for the heatmap (None: no steps table)
    # ns to subtract from each rank's times to put it on the run's clock (``Run.clock_offsets``:
    # estimated from collectives for traces from several hosts; empty otherwise)
    clock_offsets: dict[int, int] = field(default_factory=dict)
    # a failed run's ranks' last steps from the step record (empty: it did not fail, or none)
    tails: list[RankTail] = field(default_factory=list)

    @property
    def ranks(self) -> list[RankSummary]:
        return self.report.ranks

    @property
    def ops(self) -> list[TopOp]:
        return self.report.top_ops

    @property
    def steps(self) -> list[StepSummary]:
        return self.report.per_step

    @property
    def stats(self) -> StepStats | None:
        return self.report.step_stats

    @property
    def step_numbers(self) -> list[int | None]:
        return [row.step for row in self.report.per_step]

    @property
    def rank_numbers(self) -> list[int]:
        return [row.rank for row in self.report.ranks]

    @property
    def straggler(self) -> RankSummary | None:
        return self.report.straggler

    @property
    def dimensions(self) -> dict[str, dict[int, list[int]]]:
        return rank_dimensions(self.report)


def build_view(run: Run) -> RunView:
    """The rows of every screen for ``run`` (tens of milliseconds: call it from a worker)."""
    report = run.report(ALL_OPS)
    return RunView(
        label=run.label,
        report=report,
        tails=run.rank_tails() if report.failure is not None else [],
        windows=windows_by_step(run.steps),
        threads=run.manifest.threads(),
        hosts={r.rank: r.host for r in run.manifest.ranks if r.host},
        matrix=step_matrix(run.steps) if run.steps.num_rows else None,
        clock_offsets=run.clock_offsets(),
    )


def build_comparison(runs: list[Run], views: list[RunView]) -> Comparison | None:
    """``analysis.compare`` of the runs (the first is the baseline); None for a single run."""
    if len(runs) < 2:
        return None
    return compare([v.report for v in views], [r.ops for r in runs], [v.label for v in views])


# --- operators: filter and sort (pure, over the report's rows) ---------------------------------

#: Sort orders of the operators table, in the order the `s` key cycles through them.
OP_SORTS: dict[str, tuple[str, bool]] = {
    "self": ("self_ms_per_step", True),
    "total": ("total_ms_per_step", True),
    "calls": ("calls_per_step", True),
    "mean": ("mean_ms", True),
    "p95": ("p95_ms", True),
    "op": ("op", False),
}


def sort_ops(rows: list[TopOp], key: str) -> list[TopOp]:
    attr, descending = OP_SORTS[key]
    # Ties broken by name so the order never depends on how the analysis grouped rows.
    ordered = sorted(rows, key=lambda r: (r.op, r.device, r.phase, r.name))
    return sorted(ordered, key=lambda r: getattr(r, attr), reverse=descending)


def filter_kernels(
    rows: list[KernelLaunches], text: str = "", phase: str | None = None
) -> list[KernelLaunches]:
    """Kernel-launch rows whose operator contains ``text`` (case-insensitive), of ``phase``."""
    needle = text.strip().lower()
    return [
        r
        for r in rows
        if (phase is None or r.phase == phase) and (not needle or needle in (r.op or "").lower())
    ]


def filter_ops(rows: list[TopOp], text: str = "", phase: str | None = None) -> list[TopOp]:
    """Rows whose canonical or framework name contains ``text`` (any case), of ``phase``."""
    needle = text.strip().lower()
    return [
        r
        for r in rows
        if (phase is None or r.phase == phase)
        and (not needle or needle in r.op.lower() or needle in r.name.lower())
    ]


#: Sort orders of the ranks table (`s`): slowest first by default.
RANK_SORTS: dict[str, tuple[str, bool]] = {
    "busy": ("busy_ms", True),
    "step": ("step_ms", True),
    "blocked": ("blocked_ms", True),
    "wait": ("comm_wait_ms", True),  # null (not matched across ranks) sorts last
    "rank": ("rank", False),
}


_RANK_RANGE = re.compile(r"^(\d*)-(\d*)$")


def filter_ranks(rows: list[RankSummary], text: str, hosts: dict[int, str]) -> list[RankSummary]:
    """Rows chosen by ``text``: comma- or space-separated rank numbers and ranges (``0-15``,
    ``32``, ``1000-``), ``straggler``, or any other word: a part of the rank's host name. A
    row is shown when any term chooses it; empty text chooses every row."""
    terms = [t for t in re.split(r"[,\s]+", text.strip().lower()) if t]
    if not terms:
        return rows
    singles: set[int] = set()
    spans: list[tuple[int, int]] = []
    words: list[str] = []
    straggler = False
    for term in terms:
        span = _RANK_RANGE.match(term)
        if term.isdigit():
            singles.add(int(term))
        elif span and (span[1] or span[2]):
            spans.append((int(span[1] or 0), int(span[2]) if span[2] else 1 << 62))
        elif term in ("straggler", "*"):
            straggler = True
        else:
            words.append(term)
    return [
        r
        for r in rows
        if r.rank in singles
        or any(lo <= r.rank <= hi for lo, hi in spans)
        or (straggler and r.straggler)
        or any(w in hosts.get(r.rank, "").lower() for w in words)
    ]


def sort_ranks(rows: list[RankSummary], key: str) -> list[RankSummary]:
    attr, descending = RANK_SORTS[key]
    ordered = sorted(rows, key=lambda r: r.rank)
    known = [r for r in ordered if getattr(r, attr) is not None]
    unknown = [r for r in ordered if getattr(r, attr) is None]
    return sorted(known, key=lambda r: getattr(r, attr), reverse=descending) + unknown


# --- ranks grouped by mesh dimension (and pipeline stage) -----------------------------------------

#: The grouping of ranks by pipeline stage (beside the mesh's dimensions).
STAGE = "stage"


def rank_dimensions(report: RunReport) -> dict[str, dict[int, list[int]]]:
    """Per mesh dimension the run's groups have (``dp``, ``tp``, in the report's order), and
    ``stage`` where its point-to-point calls form a pipeline: each rank's group in it (that
    group's ranks). Empty for a run without either (pure data parallelism)."""
    out: dict[str, dict[int, list[int]]] = {}
    for group in report.groups:
        if group.dim is not None and group.ranks:
            members = out.setdefault(group.dim, {})
            for rank in group.ranks:
                members.setdefault(rank, group.ranks)
    if report.pipeline is not None:
        out[STAGE] = {rank: stage.ranks for stage in report.pipeline.stages for rank in stage.ranks}
    return out


def group_ranks(
    rows: list[RankSummary], groups: dict[int, list[int]]
) -> list[tuple[list[int] | None, list[RankSummary]]]:
    """``rows`` (in their order) under the group each rank belongs to, groups by their lowest
    rank; ranks in none of them last, under None."""
    by_group: dict[tuple[int, ...] | None, list[RankSummary]] = {}
    for row in rows:
        members = groups.get(row.rank)
        by_group.setdefault(tuple(sorted(members)) if members else None, []).append(row)
    keys = sorted((k for k in by_group if k is not None), key=lambda k: k)
    out: list[tuple[list[int] | None, list[RankSummary]]] = [(list(k), by_group[k]) for k in keys]
    if None in by_group:
        out.append((None, by_group[None]))
    return out


def rank_list(ranks: list[int]) -> str:
    """Ranks as short text: runs of consecutive ranks as ranges (``0-7,16``)."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# --- timeline axis ----------------------------------------------------------------------------


def nice_ticks(span_ms: float, cells: int, min_gap: int = 12) -> float:
    """A round tick interval (1, 2 or 5 × 10^k ms) with ticks at least ``min_gap`` cells apart."""
    if span_ms <= 0 or cells <= 0:
        return 1.0
    target = span_ms * min_gap / cells
    base = 10 ** math.floor(math.log10(target))
    for factor in (1, 2, 5, 10):
        if base * factor >= target:
            return float(base * factor)
    return float(base * 10)
