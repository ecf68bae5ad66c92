"""The whole run from its step record: every step of every rank, profiled or not (the record's
rows: schema.RECORD_STEPS_SCHEMA). ``report``'s ``whole_run`` and ``watch``'s figures.

- The job's step is its slowest rank's (a synchronous job's ranks wait for each other; where
  they do not, it is still the step the job's progress is held to).
- A rank's own work in a step is the step less its time blocked in the collectives it called:
  the rank the others wait for has the most (the slowest rank).
- A slow step is one above ``SLOW_FACTOR`` times the median of the ``RUNNING`` steps before it;
  a change is where the step time moves to another level and stays there (binary segmentation
  of the log step time, spikes set to the running median first).

Pure functions over Arrow/Polars; vectorized over the steps (1,024 ranks, 100,000 steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.results.live import SlowStep, StepChange, WholeRun

#: a step this many times the running median before it is a slow step
SLOW_FACTOR = 1.5
#: the steps the running median looks back over
RUNNING = 51
#: the slow steps named, at most (the slowest, in step order)
MAX_SLOW = 20
#: a rank is the slowest where its own work per step exceeds the median rank's by this share
#: of the job's step
SLOWEST_MARGIN = 0.02
#: a level shift: this relative change or more, segments of ``MIN_SEGMENT`` steps or more,
#: and a shift ``MIN_SCORE`` robust standard errors wide; at most ``MAX_CHANGES`` of them
MIN_SHIFT = 0.10
MIN_SEGMENT = 8
MIN_SCORE = 6.0
MAX_CHANGES = 8


def job_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """Per step number, in order: the job's step (``ms``: its slowest rank's), the ranks that
    finished it, and the rank with the most own work in it (``rank``)."""
    own = (pl.col(S.END_NS) - pl.col(S.START_NS) - pl.col(S.COMM_NS)).alias("own")
    return (
        steps.with_columns(own, ((pl.col(S.END_NS) - pl.col(S.START_NS)) / 1e6).alias("ms"))
        .group_by(S.STEP)
        .agg(
            pl.col("ms").max(),
            pl.len().alias("ranks"),
            pl.col(S.RANK).sort_by("own").last().alias(S.RANK),
            pl.col(S.END_NS).max(),
        )
        .sort(S.STEP)
    )


#: a step is compared with the running median once this many steps are before it
HISTORY = 5


def running_median(values: np.ndarray, window: int = RUNNING) -> np.ndarray:
    """The median of the up-to ``window`` values before each one (NaN for the first
    ``HISTORY``)."""
    series = pl.Series(values, dtype=pl.Float64).shift(1)
    return series.rolling_median(window, min_samples=HISTORY).to_numpy()


#: A profile window's steps: (window, the step its profile began in, its last recorded step)
Spans = Sequence[tuple[int, int, int]]


def profiled(numbers: np.ndarray, windows: Spans) -> np.ndarray:
    """Which step numbers a profile window holds, warm-up included, and the step after its
    last (its trace is written as that one begins): -1 for none, else the window."""
    found = np.full(len(numbers), -1, np.int64)
    for window, began, last in windows:
        found[(numbers >= began) & (numbers <= last + 1)] = window
    return found


def whole_run(steps: pa.Table, windows: Spans = ()) -> WholeRun | None:
    """The whole run's figures from the record's steps; None where it holds none. A profile
    window's steps (``windows``) count in the step time, are named as such among the slow
    steps, and are left out of the level changes (a profiler's cost is not the job's)."""
    frame = pl.from_arrow(steps)
    assert isinstance(frame, pl.DataFrame)
    if frame.height == 0:
        return None
    ranks = frame[S.RANK].n_unique()
    per_step = job_steps(frame)
    # the steps every rank finished (a rank that died or lags leaves the last ones out)
    full = per_step.filter(pl.col("ranks") == ranks)
    counted = full if full.height else per_step
    ms = counted["ms"].to_numpy()
    numbers = counted[S.STEP].to_numpy()
    slowest, own = slowest_rank(frame, float(np.median(ms)))
    inside = profiled(numbers, windows)
    return WholeRun(
        steps=int(counted.height),
        step_ms_p50=_ms(np.percentile(ms, 50)),
        step_ms_p99=_ms(np.percentile(ms, 99)),
        slow_steps=slow_steps(numbers, ms, counted[S.RANK].to_numpy(), inside),
        slowest_rank=slowest,
        own_ms=own,
        changes=step_changes(numbers[inside < 0], ms[inside < 0], frame),
        first_step=int(numbers[0]),
        last_step=int(numbers[-1]),
    )


def slowest_rank(frame: pl.DataFrame, step_ms: float) -> tuple[int | None, list[float]]:
    """The rank with the most own work per step (mean, each step's clipped at three times the
    rank's median: one checkpoint does not make a rank slow), where it stands out by
    ``SLOWEST_MARGIN`` of the step; and every rank's own work per step (ms), by rank."""
    own = (
        frame.with_columns(
            ((pl.col(S.END_NS) - pl.col(S.START_NS) - pl.col(S.COMM_NS)) / 1e6).alias("own")
        )
        .group_by(S.RANK)
        .agg(pl.col("own").clip(upper_bound=pl.col("own").median() * 3).mean())
        .sort(S.RANK)
    )
    values = own["own"].to_numpy()
    if not len(values):
        return None, []
    top = int(np.argmax(values))
    stands_out = values[top] - float(np.median(values)) > SLOWEST_MARGIN * step_ms
    rank = int(own[S.RANK][top]) if stands_out and len(values) > 1 else None
    return rank, [_ms(v) or 0.0 for v in values]


def slow_steps(
    numbers: np.ndarray, ms: np.ndarray, ranks: np.ndarray, inside: np.ndarray
) -> list[SlowStep]:
    """The steps above ``SLOW_FACTOR`` times the running median before them (the slowest
    ``MAX_SLOW``, in step order), each with the profile window it lies in (``inside``)."""
    before = running_median(ms)
    slow = np.flatnonzero(ms > SLOW_FACTOR * np.nan_to_num(before, nan=np.inf))
    slow = np.sort(slow[np.argsort(-ms[slow], kind="stable")[:MAX_SLOW]])
    return [
        SlowStep(
            step=int(numbers[i]),
            ms=_ms(ms[i]) or 0.0,
            rank=int(ranks[i]),
            window=int(inside[i]) if inside[i] >= 0 else None,
        )
        for i in slow
    ]


def step_changes(numbers: np.ndarray, ms: np.ndarray, frame: pl.DataFrame) -> list[StepChange]:
    """The step time's level shifts (binary segmentation of its log, spikes set to the running
    median first), each with the rank whose own work moved most with it."""
    if len(ms) < 2 * MIN_SEGMENT:
        return []
    before = running_median(ms)
    level = np.where(ms > SLOW_FACTOR * np.nan_to_num(before, nan=np.inf), before, ms)
    series = np.log(np.maximum(level, 1e-6))
    # the noise: the steps' robust spread from one step to the next (a level shift is one jump)
    noise = 1.4826 * float(np.median(np.abs(np.diff(series)))) / math.sqrt(2)
    noise = max(noise, 1e-3)
    cuts = sorted(_segment(series, 0, len(series), noise, MAX_CHANGES))
    found = []
    bounds = [0, *cuts, len(series)]
    for i, cut in enumerate(cuts):
        left, right = level[bounds[i] : cut], level[cut : bounds[i + 2]]
        a, b = float(np.median(left)), float(np.median(right))
        if abs(b - a) < MIN_SHIFT * min(a, b):
            continue
        found.append(
            StepChange(
                step=int(numbers[cut]),
                ms_before=_ms(a) or 0.0,
                ms_after=_ms(b) or 0.0,
                rank=_moved_rank(
                    frame, numbers[bounds[i] : cut], numbers[cut : bounds[i + 2]], b > a
                ),
            )
        )
    return found


def _segment(series: np.ndarray, start: int, end: int, noise: float, budget: int) -> list[int]:
    """The cuts of ``series[start:end]``: its best split where it scores ``MIN_SCORE`` or more,
    then each side's own."""
    n = end - start
    if budget <= 0 or n < 2 * MIN_SEGMENT:
        return []
    part = series[start:end]
    sums = np.cumsum(part)
    k = np.arange(MIN_SEGMENT, n - MIN_SEGMENT + 1)
    left = sums[k - 1] / k
    right = (sums[-1] - sums[k - 1]) / (n - k)
    score = np.abs(right - left) * np.sqrt(k * (n - k) / n) / noise
    best = int(np.argmax(score))
    if score[best] < MIN_SCORE:
        return []
    cut = start + int(k[best])
    rest = budget - 1
    lower = _segment(series, start, cut, noise, rest // 2 + rest % 2)
    upper = _segment(series, cut, end, noise, rest // 2)
    return [*lower, cut, *upper]


def _moved_rank(
    frame: pl.DataFrame, before: np.ndarray, after: np.ndarray, rose: bool
) -> int | None:
    """The rank whose own work per step (median) rose most from ``before`` to ``after`` (fell
    most, where the step time fell: ``rose`` False)."""
    own = (pl.col(S.END_NS) - pl.col(S.START_NS) - pl.col(S.COMM_NS)).alias("own")
    medians = []
    for numbers in (before, after):
        medians.append(
            frame.filter(pl.col(S.STEP).is_in(numbers.tolist()))
            .group_by(S.RANK)
            .agg(own.median())
            .sort(S.RANK)
        )
    joined = medians[0].join(medians[1], on=S.RANK, suffix="_after")
    if joined.height == 0:
        return None
    moved = (joined["own_after"] - joined["own"]).to_numpy()
    return int(joined[S.RANK][int(np.argmax(moved if rose else -moved))])


def _ms(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 3)


def step_changes_of(
    numbers: np.ndarray, ms: np.ndarray, rows: dict[int, np.ndarray], windows: Spans = ()
) -> list[StepChange]:
    """``step_changes`` where each rank's steps are record rows (parsers.record.STEP_DTYPE),
    the profile windows' steps left out."""
    outside = profiled(numbers, windows) < 0
    numbers, ms = numbers[outside], ms[outside]
    frame = (
        pl.DataFrame(
            {
                S.RANK: np.concatenate([np.full(len(r), k, np.int32) for k, r in rows.items()]),
                S.STEP: np.concatenate([r["step"].astype(np.int64) for r in rows.values()]),
                S.START_NS: np.concatenate([r["start_ns"] for r in rows.values()]),
                S.END_NS: np.concatenate([r["end_ns"] for r in rows.values()]),
                S.COMM_NS: np.concatenate([r["comm_ns"] for r in rows.values()]),
            }
        )
        if rows
        else pl.DataFrame()
    )
    if frame.height == 0:
        return []
    return step_changes(numbers, ms, frame)
