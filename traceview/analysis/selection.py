"""Which steps the headline figures count: decided once per run, for every rank alike.

By default, leading steps well above the median of the steps after them (allocator growth,
cuDNN autotuning, lazy initialization) are left out as warm-up, and a last step of a tenth of
the median or less, or one that holds no work at all on any rank (the profiler's window after
the job's last ``step()``), as trailing; a later outlier is named and kept. ``--steps A-B`` (the trace's own step numbers) and ``--skip N`` (the first N steps) choose
instead, and then nothing is left out as warm-up. The decision is over the run's per-step
means across ranks (never per rank), so every figure of every rank counts the same steps.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field

import polars as pl

from traceview.model import schema as S
from traceview.model.choice import StepChoice
from traceview.model.errors import UsageError
from traceview.model.results import StepExclusion
from traceview.model.vocabulary import BREAKDOWN_PHASES, IDLE

__all__ = ["MIN_COUNTED", "WARMUP_FACTOR", "Selection", "StepChoice", "kept_rows", "select_steps"]

#: A leading step this much slower than the median of the steps after it is warm-up.
WARMUP_FACTOR = 1.3
#: Warm-up is only left out where at least this many steps remain to count.
MIN_COUNTED = 2
#: The warm-up steps a report names one by one (the rest: counted in one remark)
_WARMUPS_NAMED = 5
#: Leading steps whose median of the steps after them is taken alone (a sort each); past
#: them, every such median at once (a run whose steps shorten one after another throughout
#: took minutes at 100,000 steps)
_MEDIANS_ONE_BY_ONE = 8
#: A last step under this share of the median of the steps before it is no step of the job: the
#: window a profiler opens at the job's last ``step()`` and closes when it stops (a per-step
#: export's last file, a profile without a schedule), holding little or none of its work.
TRAILING_SHARE = 0.1
#: The phases that are work: a step whose time is all idle (on every rank) ran none of the job.
WORK_PHASES = tuple(p for p in BREAKDOWN_PHASES if p != IDLE)


@dataclass
class Selection:
    """The steps the headline figures count, and why each other step is left out."""

    kept: list[int]  # step numbers, ascending
    excluded: dict[int, tuple[StepExclusion, str]] = field(default_factory=dict)  # step -> why
    remarks: list[str] = field(default_factory=list)  # what a reader is told about it

    @property
    def any_excluded(self) -> bool:
        return bool(self.excluded)


def _ms(value: float) -> str:
    return f"{value:,.1f} ms" if value >= 1 else f"{value:.2f} ms"


def _range(numbers: list[int]) -> str:
    return f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


def select_steps(
    steps: pl.DataFrame, choice: StepChoice | None = None, named: frozenset[int] = frozenset()
) -> Selection | None:
    """The selection over ``steps`` (the complete steps of every rank: rank, step, wall_ns);
    ``named``: the steps the trace itself calls warm-up (an annotation named so), left out by
    default where a step remains.
    None where the steps are unnumbered (one window with no step number: nothing to choose
    from; a choice there is a UsageError). UsageError: a choice that leaves no step."""
    numbered = steps.height > 0 and steps[S.STEP].null_count() == 0
    if not numbered:
        if choice is not None:
            raise UsageError(
                f"{choice.describe()}: the run has no numbered steps (it is analysed as one "
                "window), so there are no steps to choose"
            )
        return None
    per_step = steps.group_by(S.STEP).agg(pl.col(S.WALL_NS).mean().alias("mean")).sort(S.STEP)
    numbers = per_step[S.STEP].cast(pl.Int64).to_list()
    # (numpy's division: the same floats as one at a time; polars' may differ in the last bit)
    means = (per_step["mean"].cast(pl.Float64).to_numpy() / 1e6).tolist()
    excluded: dict[int, tuple[StepExclusion, str]] = {}
    remarks: list[str] = []
    if choice is None:
        said = [n for n in numbers if n in named]
        if said and len(said) < len(numbers):
            for n in said:
                excluded[n] = ("warm-up", "the trace's own annotation calls it warm-up")
            remarks.append(
                f"step(s) {', '.join(map(str, said))} left out as warm-up: the trace's own "
                "annotations call them so (traceview report --skip 0 keeps them, --steps A-B chooses)"
            )
        numbers_left = [n for n in numbers if n not in excluded]
        means_left = [m for n, m in zip(numbers, means, strict=True) if n not in excluded]
        # Leading steps above WARMUP_FACTOR x the median of the steps after them, while at
        # least MIN_COUNTED steps remain (one step left is no steady state to compare with).
        suffix: list[float] | None = None  # (a long warm-up: every median at once)
        warmups = 0
        for i in range(len(means_left) - MIN_COUNTED):
            if i < _MEDIANS_ONE_BY_ONE:
                median = statistics.median(means_left[i + 1 :])
            else:
                suffix = suffix or _suffix_medians(means_left)
                median = suffix[i + 1]
            if median <= 0 or means_left[i] <= median * WARMUP_FACTOR:
                break
            why = f"{_ms(means_left[i])} against a median of {_ms(median)} of the steps after it"
            excluded[numbers_left[i]] = ("warm-up", why)
            warmups += 1
            if warmups <= _WARMUPS_NAMED:
                remarks.append(
                    f"step {numbers_left[i]} left out as warm-up: {why} (a leading step over "
                    f"{WARMUP_FACTOR}x; traceview report --skip 0 keeps it, --steps A-B chooses)"
                )
        if warmups > _WARMUPS_NAMED:
            remarks.append(
                f"and {warmups - _WARMUPS_NAMED} more leading step(s) left out as warm-up alike, "
                f"to step {numbers_left[warmups - 1]}"
            )
        left = [(n, m) for n, m in zip(numbers, means, strict=True) if n not in excluded]
        if len(left) > 1:
            (last, mean), median = left[-1], statistics.median(m for _, m in left[:-1])
            short = len(left) > MIN_COUNTED and median > 0 and mean < median * TRAILING_SHARE
            if short or (last in _idle_steps(steps) and median > mean):
                what = (
                    f"a last step under {TRAILING_SHARE:.0%} of the median"
                    if short
                    else "a last step in which no rank did any work"
                )
                why = f"{_ms(mean)} against a median of {_ms(median)} of the steps before it"
                excluded[last] = ("trailing", why)
                remarks.append(
                    f"step {last} left out: {why}, the window a profiler opens at the job's "
                    f"last step() and closes when it stops ({what}; traceview report --skip 0 "
                    "keeps it)"
                )
    else:
        chosen = numbers
        if choice.first is not None and choice.last is not None:
            chosen = [n for n in numbers if choice.first <= n <= choice.last]
            if not chosen:
                raise UsageError(
                    f"--steps {choice.first}-{choice.last}: the run has no step in that range "
                    f"(its steps are {_range(numbers)})"
                )
        if choice.skip is not None:
            if choice.skip >= len(chosen):
                raise UsageError(
                    f"--skip {choice.skip}: that leaves no step (the run has {len(chosen)} "
                    f"step(s) to choose from: {_range(chosen)})"
                )
            chosen = chosen[choice.skip :]
        keep = set(chosen)
        for n in numbers:
            if n not in keep:
                excluded[n] = ("selection", f"not in {choice.describe()}")
        if excluded:
            remarks.append(
                f"steps {_range(chosen)} counted ({choice.describe()}); "
                f"{len(excluded)} step(s) left out"
            )
    return Selection([n for n in numbers if n not in excluded], excluded, remarks)


def _idle_steps(steps: pl.DataFrame) -> set[int]:
    """The steps whose every rank's time is idle: no phase of the job in them (none where the
    table has no breakdown)."""
    work = [S.phase_ns(p) for p in WORK_PHASES]
    if any(column not in steps.columns for column in work):
        return set()
    busy = steps.group_by(S.STEP).agg(pl.sum_horizontal(work).sum().alias("work"))
    return {int(n) for n in busy.filter(pl.col("work") == 0)[S.STEP]}


def kept_rows(table: pl.DataFrame, selection: Selection | None) -> pl.DataFrame:
    """The rows of a per-step table (a ``step`` column) in the selected steps."""
    if selection is None or not selection.excluded:
        return table
    return table.filter(pl.col(S.STEP).is_in(selection.kept))


def _suffix_medians(values: list[float]) -> list[float]:
    """``statistics.median(values[j:])`` for every j, the same floats (an even count: the two
    middle values' mean), in one pass from the end over two heaps."""
    low: list[float] = []  # the smaller half, negated (a max-heap)
    high: list[float] = []
    out = [0.0] * len(values)
    for j in range(len(values) - 1, -1, -1):
        value = values[j]
        if low and value > -low[0]:
            heapq.heappush(high, value)
        else:
            heapq.heappush(low, -value)
        if len(low) > len(high) + 1:
            heapq.heappush(high, -heapq.heappop(low))
        elif len(high) > len(low):
            heapq.heappush(low, -heapq.heappop(high))
        out[j] = -low[0] if len(low) > len(high) else (-low[0] + high[0]) / 2
    return out
