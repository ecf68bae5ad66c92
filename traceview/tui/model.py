"""What the screens show, prepared from a run's analysis results, away from the UI thread.

This is the TUI's reporter (memray's ``from_snapshot`` step): it turns the report object, the
steps and ops tables and the timeline lanes into plain rows. Widgets only lay these rows out;
they never aggregate. Nothing here imports Textual, so it is testable and importable without it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import polars as pl

from traceview import schema as S
from traceview.analysis.compare import compare
from traceview.runs import Run
from traceview.text import safe

if TYPE_CHECKING:  # the timeline analysis (and pyarrow.compute) loads with the first lanes
    from traceview.analysis.timeline import Lane

#: A leading step this much slower than the median step is counted as warm-up.
WARMUP_FACTOR = 1.10
#: A later step this much slower than the median is marked slow.
SLOW_FACTOR = 1.25
#: Every operator of the run, not only the report's top ten.
ALL_OPS = 1_000_000

PHASE_WORDS = {
    S.IO: "data loading (io)",
    S.H2D: "host-to-device copying (h2d)",
    S.FORWARD: "forward",
    S.BACKWARD: "backward",
    S.UPDATE: "the optimizer update",
    S.COMM: "communication",
    S.OTHER: "other work",
    S.IDLE: "idle time",
}


@dataclass(frozen=True)
class RankRow:
    rank: int
    steps: int
    step_ms: float
    busy_ms: float  # step minus exposed communication and idle: the rank's own work
    wait_ms: float  # exposed communication + idle: waiting for the others (or the network)
    imbalance: float  # busy time relative to the median rank's (0.05: 5% busier)
    breakdown_ms: dict[str, float]
    comm_total_ms: float
    hidden: float | None  # fraction of communication hidden; None without communication
    straggler: bool


@dataclass(frozen=True)
class OpRow:
    op: str  # canonical name (untrusted: from the trace or the rules)
    name: str  # the framework's name in the trace (untrusted)
    phase: str
    device: str
    calls: float  # per step (mean of ranks)
    total_ms: float  # per step
    self_ms: float  # per step
    mean_ms: float  # per call
    p95_ms: float  # per call, the largest of the ranks' p95
    share: float  # self time as a fraction of the step


@dataclass(frozen=True)
class StepRow:
    step: int | None
    ranks: int
    mean_ms: float  # mean of ranks
    min_ms: float
    max_ms: float
    slowest_rank: int
    vs_median: float  # mean_ms relative to the median step (0.1: 10% slower)
    breakdown_ms: dict[str, float]  # mean of ranks
    mark: str  # "first", "warm-up", "slow" or ""


@dataclass(frozen=True)
class StepStats:
    count: int
    mean_ms: float
    median_ms: float
    stdev_ms: float
    min_ms: float
    max_ms: float

    @property
    def cv(self) -> float:
        return self.stdev_ms / self.mean_ms if self.mean_ms > 0 else 0.0


@dataclass
class RunView:
    """Everything the screens of one run show, computed once when the app opens."""

    label: str
    report: dict[str, Any]
    ranks: list[RankRow]  # by rank
    ops: list[OpRow]  # by self time, largest first
    steps: list[StepRow]  # by step number
    stats: StepStats
    step_numbers: list[int | None]
    windows: dict[int | None, dict[int, tuple[int, int]]]  # step -> rank -> (start, end) ns
    threads: dict[int, dict[str, str]] = field(default_factory=dict)  # rank -> thread names

    @property
    def rank_numbers(self) -> list[int]:
        return [row.rank for row in self.ranks]

    @property
    def straggler(self) -> RankRow | None:
        return next((row for row in self.ranks if row.straggler), None)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def rank_rows(report: dict[str, Any]) -> list[RankRow]:
    summary = report["summary"]
    median = _median([r["busy_ms"] for r in report["ranks"]])
    rows = []
    for r in report["ranks"]:
        rows.append(
            RankRow(
                rank=r["rank"],
                steps=r["steps"],
                step_ms=r["step_ms"],
                busy_ms=r["busy_ms"],
                wait_ms=round(r["comm_exposed_ms"] + r["breakdown_ms"][S.IDLE], 3),
                imbalance=(r["busy_ms"] - median) / median if median > 0 else 0.0,
                breakdown_ms=r["breakdown_ms"],
                comm_total_ms=r["comm_total_ms"],
                hidden=r["comm_hidden_fraction"] if r["comm_total_ms"] > 0 else None,
                straggler=r["rank"] == summary.get("straggler_rank"),
            )
        )
    return sorted(rows, key=lambda row: row.rank)


def op_rows(report: dict[str, Any]) -> list[OpRow]:
    step = report["summary"]["step_ms"]
    rows = []
    for op in report["top_ops"]:
        calls = op["calls_per_step"]
        rows.append(
            OpRow(
                op=op["op"],
                name=op["name"],
                phase=op["phase"],
                device=op["device"],
                calls=calls,
                total_ms=op["total_ms_per_step"],
                self_ms=op["self_ms_per_step"],
                mean_ms=op["total_ms_per_step"] / calls if calls else 0.0,
                p95_ms=op["p95_ms"],
                share=op["self_ms_per_step"] / step if step > 0 else 0.0,
            )
        )
    return sort_ops(rows, "self")


def step_rows(run: Run) -> tuple[list[StepRow], StepStats]:
    df = pl.from_arrow(run.steps)
    assert isinstance(df, pl.DataFrame)
    if df.height == 0:
        return [], StepStats(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    phase_cols = [S.phase_ns(p) for p in S.BREAKDOWN_PHASES]
    per_step = (
        df.group_by(S.STEP)
        .agg(
            pl.len().alias("ranks"),
            pl.col(S.WALL_NS).mean().alias("mean"),
            pl.col(S.WALL_NS).min().alias("min"),
            pl.col(S.WALL_NS).max().alias("max"),
            pl.col(S.RANK).sort_by(S.WALL_NS, S.RANK).last().alias("slowest"),
            *(pl.col(c).mean() for c in phase_cols),
        )
        .sort(S.STEP, nulls_last=True)
    )
    means = [float(v) / 1e6 for v in per_step["mean"]]
    median = _median(means)
    marks = [""] * len(means)
    if means:
        marks[0] = "first"
    for i, value in enumerate(means):  # leading steps well above the median: warm-up
        if median <= 0 or value <= median * WARMUP_FACTOR:
            break
        marks[i] = "warm-up"
    for i, value in enumerate(means):
        if not marks[i] and median > 0 and value > median * SLOW_FACTOR:
            marks[i] = "slow"
    rows = []
    for i, row in enumerate(per_step.iter_rows(named=True)):
        rows.append(
            StepRow(
                step=row[S.STEP],
                ranks=row["ranks"],
                mean_ms=means[i],
                min_ms=row["min"] / 1e6,
                max_ms=row["max"] / 1e6,
                slowest_rank=row["slowest"],
                vs_median=(means[i] - median) / median if median > 0 else 0.0,
                breakdown_ms={p: row[S.phase_ns(p)] / 1e6 for p in S.BREAKDOWN_PHASES},
                mark=marks[i],
            )
        )
    stats = StepStats(
        count=len(means),
        mean_ms=statistics.fmean(means),
        median_ms=median,
        stdev_ms=statistics.stdev(means) if len(means) > 1 else 0.0,
        min_ms=min(means),
        max_ms=max(means),
    )
    return rows, stats


def step_windows(run: Run) -> dict[int | None, dict[int, tuple[int, int]]]:
    windows: dict[int | None, dict[int, tuple[int, int]]] = {}
    columns = run.steps.select([S.STEP, S.RANK, S.START_NS, S.END_NS]).to_pydict()
    for step, rank, start, end in zip(
        columns[S.STEP], columns[S.RANK], columns[S.START_NS], columns[S.END_NS], strict=True
    ):
        windows.setdefault(step, {})[rank] = (start, end)
    return windows


def build_view(run: Run) -> RunView:
    """The rows of every screen for ``run`` (tens of milliseconds: call it from a worker)."""
    report = run.report(ALL_OPS)
    steps, stats = step_rows(run)
    windows = step_windows(run)
    threads = {
        int(r["rank"]): dict(r.get("threads") or {})
        for r in run.manifest.get("ranks", [])
        if isinstance(r, dict) and "rank" in r
    }
    return RunView(
        label=run.label,
        report=report,
        ranks=rank_rows(report),
        ops=op_rows(report),
        steps=steps,
        stats=stats,
        step_numbers=[row.step for row in steps],
        windows=windows,
        threads=threads,
    )


def build_comparison(runs: list[Run], views: list[RunView]) -> dict[str, Any] | None:
    """``analysis.compare`` of the runs (the first is the baseline); None for a single run."""
    if len(runs) < 2:
        return None
    return compare([v.report for v in views], [r.ops for r in runs], [v.label for v in views])


# --- operators: filter and sort (pure, over the prepared rows) ------------------------------------

#: Sort orders of the operators table, in the order the `s` key cycles through them.
OP_SORTS: dict[str, tuple[str, bool]] = {
    "self": ("self_ms", True),
    "total": ("total_ms", True),
    "calls": ("calls", True),
    "mean": ("mean_ms", True),
    "p95": ("p95_ms", True),
    "op": ("op", False),
}


def sort_ops(rows: list[OpRow], key: str) -> list[OpRow]:
    attr, descending = OP_SORTS[key]
    # Ties broken by name so the order never depends on how the analysis grouped rows.
    ordered = sorted(rows, key=lambda r: (r.op, r.device, r.phase, r.name))
    return sorted(ordered, key=lambda r: getattr(r, attr), reverse=descending)


def filter_ops(rows: list[OpRow], text: str = "", phase: str | None = None) -> list[OpRow]:
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
    "wait": ("wait_ms", True),
    "rank": ("rank", False),
}


def sort_ranks(rows: list[RankRow], key: str) -> list[RankRow]:
    attr, descending = RANK_SORTS[key]
    ordered = sorted(rows, key=lambda r: r.rank)
    return sorted(ordered, key=lambda r: getattr(r, attr), reverse=descending)


# --- timeline ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankLanes:
    """The lanes of one rank for one step (``step_lanes``), or why there are none."""

    rank: int
    step: int | None
    start_ns: int
    end_ns: int
    lanes: list[Lane]
    error: str | None = None


def rank_lanes(run: Run, rank: int, step: int | None, threads: dict[str, str]) -> RankLanes:
    """Read one rank's events and cut its lanes for ``step`` (10-100 ms: a worker's job)."""
    from traceview.analysis.timeline import step_lanes

    events = run.events([rank])
    if events.num_rows == 0:
        return RankLanes(rank, step, 0, 0, [], "no events")
    try:
        start, end, lanes = step_lanes(events, step, threads)
    except KeyError:
        return RankLanes(rank, step, 0, 0, [], f"no step {step}")
    for lane in lanes:
        lane.label = safe(lane.label)
    return RankLanes(rank, step, start, end, lanes)


_PHASE_CODE = {phase: i for i, phase in enumerate(S.BREAKDOWN_PHASES)}
#: Which phase wins a cell when two cover it equally: the attribution's priority.
_TIE_ORDER = (S.FORWARD, S.BACKWARD, S.UPDATE, S.H2D, S.IO, S.COMM, S.OTHER, S.IDLE)


def _merge(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return s[heads], np.maximum.reduceat(e, heads)


def _covered_until(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Time covered by the disjoint sorted intervals (s, e) before each instant of ``t``."""
    before = np.concatenate([[0.0], np.cumsum(e - s)])
    k = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    last = np.maximum(k - 1, 0)
    partial = np.where(k > 0, np.clip(t - s[last], 0, (e - s)[last]), 0.0)
    return before[last] * (k > 0) + partial


#: A cell is drawn solid when its phase covers at least this much of it, as a plain letter below.
SOLID = 0.5

Cell: TypeAlias = tuple[str, bool] | None  # (phase, solid); None: nothing in the cell


def bin_lane(lane: Lane, lo: int, hi: int, width: int) -> list[Cell]:
    """What to draw in each of ``width`` cells spanning [lo, hi) ns.

    A cell shows the phase covering most of it other than idle (ties by priority), solid when
    it covers at least half the cell; idle where only idle time is in the cell; None where
    nothing is. So a lane with short kernels and long gaps still shows where the kernels are,
    and which cells they fill.
    """
    cells: list[Cell] = [None] * max(width, 0)
    if width <= 0 or hi <= lo or len(lane.starts) == 0:
        return cells
    edges = np.linspace(0.0, float(hi - lo), width + 1)
    starts = (lane.starts - lo).astype(np.float64)
    ends = (lane.ends - lo).astype(np.float64)
    codes = np.array([_PHASE_CODE.get(p, _PHASE_CODE[S.OTHER]) for p in lane.phases])
    best = np.zeros(width)
    winner = np.full(width, -1)
    idle = np.zeros(width)
    for phase in _TIE_ORDER:
        mask = (codes == _PHASE_CODE[phase]) & (ends > 0) & (starts < edges[-1])
        if not mask.any():
            continue
        s, e = _merge(starts[mask], ends[mask])
        covered = _covered_until(s, e, edges)
        amount = covered[1:] - covered[:-1]
        if phase == S.IDLE:
            idle = amount
            continue
        better = amount > best
        winner[better] = _PHASE_CODE[phase]
        best[better] = amount[better]
    cell = edges[1] - edges[0]
    for i in range(width):
        if winner[i] >= 0:
            cells[i] = (S.BREAKDOWN_PHASES[winner[i]], bool(best[i] >= SOLID * cell))
        elif idle[i] > 0:
            cells[i] = (S.IDLE, False)
    return cells


def nice_ticks(span_ms: float, cells: int, min_gap: int = 12) -> float:
    """A round tick interval (1, 2 or 5 × 10^k ms) with ticks at least ``min_gap`` cells apart."""
    if span_ms <= 0 or cells <= 0:
        return 1.0
    target = span_ms * min_gap / cells
    base = 10 ** np.floor(np.log10(target))
    for factor in (1, 2, 5, 10):
        if base * factor >= target:
            return float(base * factor)
    return float(base * 10)
