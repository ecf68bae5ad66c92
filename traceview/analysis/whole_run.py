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

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.step_series import (
    MAX_SLOW,
    SLOWEST_MARGIN,
    OwnByRank,
    Spans,
    profiled,
    rounded,
    slow_indices,
    step_changes,
)
from traceview.model import schema as S
from traceview.model.results.live import SlowStep, WholeRun


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
        step_ms_p50=rounded(np.percentile(ms, 50)),
        step_ms_p99=rounded(np.percentile(ms, 99)),
        slow_steps=slow_steps(numbers, ms, counted[S.RANK].to_numpy(), inside),
        slowest_rank=slowest,
        own_ms=own,
        changes=step_changes(numbers[inside < 0], ms[inside < 0], own_by_rank(frame)),
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
    return rank, [rounded(v) or 0.0 for v in values]


def slow_steps(
    numbers: np.ndarray, ms: np.ndarray, ranks: np.ndarray, inside: np.ndarray
) -> list[SlowStep]:
    """The steps above ``SLOW_FACTOR`` times the running median before them (the slowest
    ``MAX_SLOW``, in step order), each with the profile window it lies in (``inside``)."""
    slow = slow_indices(ms)
    slow = np.sort(slow[np.argsort(-ms[slow], kind="stable")[:MAX_SLOW]])
    return [
        SlowStep(
            step=int(numbers[i]),
            ms=rounded(ms[i]) or 0.0,
            rank=int(ranks[i]),
            window=int(inside[i]) if inside[i] >= 0 else None,
        )
        for i in slow
    ]


def own_by_rank(frame: pl.DataFrame) -> OwnByRank:
    """Each rank's own work per step (ms), by step number."""
    own = frame.select(
        S.RANK,
        S.STEP,
        ((pl.col(S.END_NS) - pl.col(S.START_NS) - pl.col(S.COMM_NS)) / 1e6).alias("own"),
    ).sort(S.RANK, S.STEP)
    return {
        int(part[S.RANK][0]): (part[S.STEP].to_numpy(), part["own"].to_numpy())
        for part in own.partition_by(S.RANK)
    }
