"""Per-step figures and which steps count: warm-up, slow and incomplete steps, startup time, and
where the steps came from."""

from __future__ import annotations

import statistics
from typing import cast, get_args

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.roles import run_roles
from traceview.analysis.rounding import rounded
from traceview.analysis.selection import (
    WARMUP_FACTOR,
    Selection,
    StepChoice,
    kept_rows,
    select_steps,
)
from traceview.analysis.summary.units import _median, _ms, exact_ms_column
from traceview.model import schema as S
from traceview.model.manifest import Manifest
from traceview.model.results import (
    Breakdown,
    HostBound,
    IncompleteStep,
    StepsFrom,
    StepStats,
    StepSummary,
    from_columns,
)

SLOW_FACTOR = 1.25  # a later step this much slower than the median is marked slow
#: Breakdown's fields in the order ``_per_step`` names them
_BREAKDOWN_ORDER = ("io", "h2d", "forward", "backward", "update", "comm", "other", "idle")


def _per_step(
    df: pl.DataFrame, selection: Selection | None
) -> tuple[list[StepSummary], StepStats | None]:
    """Each step number across ranks, the ones the selection leaves out with why; the median,
    the marks and the statistics are over the counted steps: a later step well above their
    median is slow (named and kept)."""
    if df.height == 0:
        return [], None
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
            # mean of ranks, a CPU rank's phases having no host-bound part; null if none has
            *(
                pl.when(pl.col(c).is_not_null().any())
                .then(pl.col(c).fill_null(0).mean())
                .otherwise(None)
                .alias(c)
                for c in (S.host_bound_ns(p) for p in S.GPU_HOST_BOUND_PHASES)
            ),
        )
        .sort(S.STEP, nulls_last=True)
    )
    excluded = selection.excluded if selection is not None else {}
    numbers = per_step[S.STEP].to_list()
    mean_ms = per_step["mean"].cast(pl.Float64).to_numpy() / 1e6
    means = mean_ms.tolist()
    # column by column (a run of 100,000 tiny steps): each figure rounded at once
    whys = [excluded.get(n) for n in numbers] if excluded else [None] * len(numbers)
    left_out = np.array([why is not None for why in whys], bool)
    counted = mean_ms[~left_out].tolist() or means
    median = _median(counted)
    marks = np.full(len(means), "", object)
    if median > 0:  # a later counted step well above the median
        marks[~left_out & (mean_ms > median * SLOW_FACTOR)] = "slow"
    marks[0] = "first"
    marks[[i for i, why in enumerate(whys) if why is not None and why[0] == "warm-up"]] = "warm-up"
    ms = {c: exact_ms_column(per_step[c]) for c in ("min", "max", *phase_cols)}
    host_bound = _host_bound_column(per_step)
    vs = rounded((mean_ms - median) / median, 4) if median > 0 else [0.0] * len(means)
    breakdowns = from_columns(Breakdown, {p: ms[S.phase_ns(p)] for p in _BREAKDOWN_ORDER})
    rows = from_columns(
        StepSummary,
        {
            "step": numbers,
            "ranks": per_step["ranks"].to_list(),
            "step_ms": rounded(mean_ms, 6),
            "min_ms": ms["min"],
            "max_ms": ms["max"],
            "slowest_rank": per_step["slowest"].to_list(),
            "vs_median": vs,
            "breakdown_ms": breakdowns,
            "mark": marks.tolist(),
            "host_bound_ms": host_bound,
            "excluded": [None if why is None else why[0] for why in whys],
            "excluded_reason": [None if why is None else why[1] for why in whys],
            "critical_path": [None] * len(numbers),
        },
    )
    mean = statistics.fmean(counted)
    # (numpy's, not statistics.stdev: its exact fractions take 0.1 s a 100,000 steps)
    stdev = float(np.std(np.asarray(counted, np.float64), ddof=1)) if len(counted) > 1 else 0.0
    stats = StepStats(
        count=len(counted),
        mean_ms=round(mean, 6),
        median_ms=round(median, 6),
        stdev_ms=round(stdev, 6),
        min_ms=round(min(counted), 6),
        max_ms=round(max(counted), 6),
        cv=round(stdev / mean, 4) if mean > 0 else 0.0,
        warmup_factor=WARMUP_FACTOR,
        slow_factor=SLOW_FACTOR,
    )
    return rows, stats


def _host_bound_column(per_step: pl.DataFrame) -> list[HostBound | None]:
    """Each row's host-bound parts (as ``ranks._ranks`` gives a rank's, to the ns), column by
    column."""
    names = [S.host_bound_ns(p) for p in S.GPU_HOST_BOUND_PHASES]
    known = per_step.select(pl.all_horizontal(pl.col(c).is_not_null() for c in names))
    if not known.to_series().any():
        return [None] * per_step.height
    columns = [exact_ms_column(per_step[c].fill_null(0)) for c in names]
    return [
        HostBound(**dict(zip(S.GPU_HOST_BOUND_PHASES, values, strict=True))) if ok else None
        for ok, *values in zip(known.to_series().to_list(), *columns, strict=True)
    ]


def _slow_remarks(per_step: list[StepSummary]) -> list[str]:
    """Later outliers: named, and kept in the figures."""
    slow = [s for s in per_step if s.mark == "slow"]
    if not slow:
        return []
    named = ", ".join(f"step {s.step} ({s.step_ms:,.1f} ms, +{s.vs_median:.0%})" for s in slow[:5])
    more = f" and {len(slow) - 5} more" if len(slow) > 5 else ""
    return [
        f"slow step(s) kept in the figures: {named}{more} against the median of the counted steps"
    ]


def _kept_table(table: pa.Table, selection: Selection) -> pa.Table:
    """A per-rank table's rows in the selected steps (rows outside any step are dropped)."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return kept_rows(df, selection).to_arrow()


def _startup_ms(manifest: Manifest, ranks: list[int]) -> float | None:
    """Mean over the ranks with steps of their training thread's time before the first step
    (ingest's ``startup_ns``); null where no rank has it (one window, an older run)."""
    counted = set(ranks)  # (a set: 20,000 ranks looked up in a list took a second)
    found = [r.meta.get("startup_ns") for r in manifest.ranks if r.rank in counted or not ranks]
    known = [int(v) for v in found if isinstance(v, int) and v >= 0]
    return round(sum(known) / len(known) / 1e6, 3) if known else None


def _inferred_disagree(manifest: Manifest) -> list[str]:
    """A warning where the ranks' steps were inferred (or found) differently: other sources,
    or inferred steps in different numbers (the steps some ranks lack are left out of every
    figure, as incomplete steps)."""
    read = [r for r in manifest.ranks if r.events > 0]
    sources = {str(r.meta.get("steps_from")) for r in read if r.meta.get("steps_from")}
    if len(sources) > 1:
        return [
            "the ranks' steps come from different sources ("
            + ", ".join(sorted(sources))
            + "): step numbers may not mean the same iteration on every rank"
        ]
    inferred = [r for r in read if r.meta.get("steps_from") not in (None, "markers", "one_window")]
    counts = sorted({r.steps for r in inferred})
    if len(counts) > 1:
        few = min(inferred, key=lambda r: (r.steps, r.rank))
        many = max(inferred, key=lambda r: (r.steps, -r.rank))
        return [
            f"inferred steps disagree across ranks (rank {few.rank}: {few.steps}, rank "
            f"{many.rank}: {many.steps}): only the step numbers every rank has are counted"
        ]
    return []


def named_warmup(manifest: Manifest) -> frozenset[int]:
    """The steps a rank's trace itself calls warm-up (ingest's ``warmup_steps``)."""
    return frozenset(
        int(n)
        for r in manifest.ranks
        for n in (r.meta.get("warmup_steps") or [])
        if isinstance(n, int)
    )


def manifest_steps_from(manifest: Manifest) -> StepsFrom | None:
    """Where the run's steps come from, as ingest recorded it per rank (the most common where
    ranks differ; null for a run ingested before it was recorded)."""
    found = [r.meta.get("steps_from") for r in manifest.ranks]
    known = [str(v) for v in found if v in get_args(StepsFrom)]
    if not known:
        return None
    return cast(StepsFrom, max(sorted(set(known)), key=known.count))


#: A rank's own end, where it did not end cleanly (collect's state, or a trace cut short).
_ENDED_BADLY = ("exception", "signal", "crashed", "profiling", "stopping", "running", "unknown")


def incomplete_steps(
    steps: pl.DataFrame, manifest: Manifest, lockstep: bool = True
) -> pl.DataFrame:
    """(step, rank) of the steps that did not complete on every rank, the rank the step did not
    finish on (``unfinished``) or every rank that has it: the last step of a rank whose trace was
    cut short, or that died or was killed before its profile was complete (it recorded fewer steps
    than ``collect`` asked for; a rank that died after its profile was written lost no step), or
    whose profile was stopped inside a step (the memory cap), and a numbered step some ranks with
    steps lack (where the ranks keep in ``lockstep``: an asynchronous parameter server's workers
    each run their own steps)."""
    empty = pl.DataFrame(schema={S.STEP: pl.Int64, S.RANK: pl.Int32, "unfinished": pl.Boolean})
    if steps.height == 0 or steps[S.STEP].null_count() > 0:
        return empty
    bad = {r.rank for r in manifest.ranks if r.status != "ok"}
    collected = manifest.collect
    if collected is not None:
        wanted = collected.schedule.steps if collected.schedule is not None else None
        bad |= {
            r.rank
            for r in collected.ranks
            if r.rank is not None
            and (
                (
                    r.state in _ENDED_BADLY
                    and (r.profiled_steps is None or wanted is None or r.profiled_steps < wanted)
                )
                or r.stop_mid_step  # its profile was stopped inside a step (the memory cap)
            )
        }
    last = (
        steps.filter(pl.col(S.RANK).is_in(sorted(bad)))
        .group_by(S.RANK)
        .agg(pl.col(S.STEP).max())
        .select(pl.col(S.STEP).cast(pl.Int64), pl.col(S.RANK).cast(pl.Int32))
    )
    ranks = steps[S.RANK].n_unique() if lockstep else 0
    partial = steps.group_by(S.STEP).agg(pl.col(S.RANK).n_unique().alias("n"))
    partial = partial.filter(pl.col("n") < ranks).select(pl.col(S.STEP).cast(pl.Int64))
    numbers = pl.concat([last.select(S.STEP), partial]).unique()
    if numbers.height == 0:
        return empty
    unfinished = set(zip(last[S.STEP].to_list(), last[S.RANK].to_list(), strict=True))
    present = steps.filter(pl.col(S.STEP).is_in(numbers[S.STEP].to_list())).select(
        pl.col(S.STEP).cast(pl.Int64), pl.col(S.RANK).cast(pl.Int32)
    )
    return present.with_columns(
        pl.Series(
            "unfinished",
            [(s, r) in unfinished for s, r in present.iter_rows()],
            pl.Boolean,
        )
    )


def complete_flag(
    steps: pa.Table, manifest: Manifest, choice: StepChoice | None = None
) -> pa.Table:
    """The steps table with ``complete``: false for a step that did not complete on every rank
    (``incomplete_steps``), which the report leaves out of its figures; and ``excluded``: why a
    complete step is left out of the report's figures (warm-up, or not chosen by
    --steps/--skip; null: counted), the report's own selection."""
    df = pl.from_arrow(steps)
    assert isinstance(df, pl.DataFrame)
    lockstep = run_roles(manifest, df).synchronous is not False
    incomplete = incomplete_steps(df, manifest, lockstep)[S.STEP].unique().to_list()
    flag = ~df[S.STEP].is_in(incomplete).fill_null(False)
    kept = df.filter(flag)
    selection = select_steps(kept if kept.height else df, choice, named_warmup(manifest))
    why = selection.excluded if selection is not None else {}
    excluded = pl.Series(
        "excluded", [why[s][0] if s in why else None for s in df[S.STEP].to_list()], pl.String
    )
    return steps.append_column("complete", flag.to_arrow()).append_column(
        "excluded", excluded.to_arrow()
    )


def _incomplete(
    steps: pl.DataFrame, incomplete: pl.DataFrame, all_ranks: list[int]
) -> list[IncompleteStep]:
    out = []
    for step in sorted(set(incomplete[S.STEP].to_list())):
        rows = incomplete.filter(pl.col(S.STEP) == step)
        has = set(rows[S.RANK].to_list())
        unfinished = set(rows.filter(pl.col("unfinished"))[S.RANK].to_list())
        untraced = {r for r in all_ranks if r not in has}
        unfinished |= untraced  # no window: not finished there
        # who was blocked longest in it: usually a rank waiting in a collective for the one
        # that died (it may have died of that wait itself)
        others = steps.filter(pl.col(S.STEP) == step).with_columns(
            (pl.col(S.COMM_EXPOSED_NS) + pl.col(S.phase_ns(S.IDLE))).alias("blocked")
        )
        waited = others.sort("blocked", S.RANK, descending=[True, False]).head(1)
        out.append(
            IncompleteStep(
                step=step,
                unfinished_ranks=sorted(unfinished),
                untraced_ranks=sorted(untraced),
                waited_ms=_ms(waited["blocked"][0]) if waited.height else 0.0,
                waited_rank=int(waited[S.RANK][0]) if waited.height else None,
            )
        )
    return out
