"""What a report takes from the critical path (``explain``, ``Explained``), and how it is kept
for the next report of the run (``PathCache``, ``PATH_VERSION``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.blame import _OWN, _blame, _blame_per_step, _blame_rows
from traceview.analysis.critical_path.cause import (
    Candidate,
    candidates,
    cause_words,
    noise_ms,
    pick,
)
from traceview.analysis.critical_path.graph import _COMPUTING, LATE_START, NO_STEP
from traceview.analysis.critical_path.late import before
from traceview.analysis.critical_path.source import _batches, _series, _Source, _source
from traceview.analysis.critical_path.tables import _stretches
from traceview.analysis.critical_path.walk import Walks
from traceview.analysis.critical_path.whatif import _what_ifs, work_by_stage
from traceview.analysis.crossrank import Matched
from traceview.analysis.rounding import rounded
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.results import (
    Cause,
    CriticalPath,
    OpBlame,
    PathSegment,
    StepPath,
    WhatIf,
    from_columns,
)

#: Bump when the path, blame or replay change: a run directory's kept paths (PathCache) are
#: then computed again.
PATH_VERSION = 13


@dataclass
class Explained:
    """What the report takes from the critical path."""

    path: CriticalPath | None
    per_step: dict[int, StepPath]
    whatif: list[WhatIf]
    rank_blame: dict[int, float]  # per rank, its own time on the path (not transfer), ms/step
    cause: Cause | None = None  # what the step loses most to (cause.py)
    straggler: Cause | None = None  # the cause a rank holds alone that saves the most


class PathCache(Protocol):
    """Where a report keeps what it took from the critical path, per choice of steps and
    changes (``key``), for the next report of the same run (runs/: in the run
    directory, beside the tables it was computed from)."""

    def get(self, key: str) -> Explained | None: ...

    def put(self, key: str, explained: Explained) -> None: ...


@dataclass
class _Walked:
    """The walked steps of a batch, or of every batch (``joined``): arrays, not an object a
    step (a run of 100,000 tiny steps)."""

    steps: np.ndarray  # int64
    start_ns: np.ndarray
    end_ns: np.ndarray
    reasons: list[str | None]  # why a step's path is incomplete (None: complete)

    @staticmethod
    def joined(parts: list[_Walked]) -> _Walked:
        if not parts:
            empty = np.zeros(0, np.int64)
            return _Walked(empty, empty, empty, [])
        return _Walked(
            np.concatenate([p.steps for p in parts]),
            np.concatenate([p.start_ns for p in parts]),
            np.concatenate([p.end_ns for p in parts]),
            [r for p in parts for r in p.reasons],
        )

    def at(self, i: int) -> _MedianStep:
        start, end = int(self.start_ns[i]), int(self.end_ns[i])
        return _MedianStep(int(self.steps[i]), start, end, end - start)


class _MedianStep(NamedTuple):
    step: int
    start_ns: int
    end_ns: int
    step_ns: int


def explain(
    segments: pa.Table | TableOnDemand,
    matched: Matched,
    steps: list[int | None],
    counted: list[int | None],
    median_phase_ms: dict[str, float],
    extra: list[str] | None = None,
    world: int | None = None,
    clock_ms: float = 0.0,
    actions: pa.Table | None = None,
    waited_for: dict[int, float] | None = None,
) -> Explained:
    """The critical path of each of ``steps`` (every complete step, warm-up included); blame
    and the what-ifs worth reporting over the ``counted`` ones (``extra``: more changes asked
    for, as ``whatif`` takes them). The steps are walked and replayed in batches
    (``_batches``); what is kept of a walked path is its blame rows, summed per step, rank,
    phase, kind and operator (integers: the sums are the whole graph's). ``segments``: the
    table, or what reads it a piece at a time (``_source``); ``clock_ms``: how far the ranks'
    clocks may be off (estimated from collectives), within which a late start is no cause;
    ``actions``: a pipeline's, on the segments' clock (a cause on a rank holding several
    stages is its slowest stage's); ``waited_for``: by rank, the others' mean exposed wait per
    step at the calls it arrived last to (``cause.pick``)."""
    source = _source(segments, matched, steps, world, actions)
    del segments
    if source is None:
        return Explained(None, {}, [], {})
    walked: list[_Walked] = []
    rows: list[pl.DataFrame] = []
    batches = _batches(source, source.steps)
    kept: Walks | None = None  # one batch: its paths (the median's is one of them)
    for batch in batches:
        walks = source.walks(batch)
        if walks is None or not len(walks):
            continue
        walked.append(_Walked(walks.steps, walks.start_ns, walks.end_ns, walks.reasons))
        rows.append(_blame_rows(walks))
        if len(batches) == 1:
            kept = walks
        del walks
    every_step = _Walked.joined(walked)
    wanted = {NO_STEP if s is None else s for s in counted}
    counted_at = np.flatnonzero(np.isin(every_step.steps, np.fromiter(wanted, np.int64)))
    if not len(counted_at):
        return Explained(None, {}, [], {})
    step_ns = every_step.end_ns - every_step.start_ns
    complete = np.fromiter((r is None for r in every_step.reasons), bool, len(step_ns))
    # the median counted step, by its length (a tie: the lower step)
    by_length = counted_at[np.lexsort((every_step.steps[counted_at], step_ns[counted_at]))]
    median = every_step.at(int(by_length[(len(by_length) - 1) // 2]))
    every = pl.concat(rows)
    df = every.filter(pl.col("step").is_in(_series(list(wanted))))
    n = len(counted_at)
    mean_step_ms = float(np.mean(step_ns[counted_at])) / 1e6
    blame = _blame(df, n, mean_step_ms, median_phase_ms)
    step_ms = step_ns / 1e6
    blames = _blame_per_step(every, every_step.steps, step_ms, median_phase_ms)
    numbers = every_step.steps.tolist()
    per_step = dict(
        zip(
            numbers,
            from_columns(
                StepPath,
                {
                    "step_ms": rounded(step_ms, 3),
                    "complete": complete.tolist(),
                    "reason": every_step.reasons,
                    "blame": blames,
                },
            ),
            strict=True,
        )
    )
    by_op = (
        df.filter(pl.col("op").is_not_null())
        .group_by("op", "phase", "kind")
        .agg((pl.col("ns").sum() / n / 1e6).alias("ms"))
        .sort("ms", "op", "phase", "kind", descending=[True, False, False, False], nulls_last=True)
        .head(10)
    )
    # the median step's path, for the stretches the report lists: walked again, alone, unless
    # the run was one batch (a step's path is its own, in a batch or alone)
    again = kept.of_step(median.step) if kept is not None else None
    if again is None:
        alone = source.walks([median.step])
        assert alone is not None
        again = alone.path(0)
    del kept
    segs = [
        PathSegment(
            rank=x.rank,
            phase=x.phase,  # type: ignore[arg-type]
            op=x.op,
            kind=x.kind,  # type: ignore[arg-type]
            start_ms=round((x.start_ns - median.start_ns) / 1e6, 4),
            ms=round(x.dur_ns / 1e6, 4),
        )
        for x in _stretches(again.frame, median.end_ns - median.start_ns)
    ]
    del again  # (the walked paths it is a slice of: freed before the what-ifs)
    source.forget_walks()
    own = df.filter(pl.col("kind").is_in(_OWN)).group_by("rank").agg(pl.col("ns").sum())
    rank_blame = {int(r): float(v) / n / 1e6 for r, v in own.iter_rows()}
    path = CriticalPath(
        step_ms=round(median.step_ns / 1e6, 3),
        step=median.step,
        steps=n,
        complete_steps=int(complete[counted_at].sum()),
        segments=segs,
        blame=blame,
        by_op=[
            OpBlame(op=r["op"], phase=r["phase"], kind=r["kind"], ms=round(r["ms"], 3))
            for r in by_op.iter_rows(named=True)
        ],
    )
    counted_steps = sorted(wanted & set(source.steps))
    counted_in = _series(counted_steps)
    ranks = source.windows().filter(pl.col("step").is_in(counted_in))["rank"].n_unique()
    explained = path.explained
    # where most steps' paths are complete, the causes are read off those alone (an incomplete
    # path lays an unmatched call's wait on its own rank: no cause of a step is read off it)
    whole = counted_at[complete[counted_at]] if explained else counted_at
    whole_steps = every_step.steps[whole].tolist()
    waits = waited_for or {}
    if len(whole) < n:
        df_whole = df.filter(pl.col("step").is_in(_series(whole_steps)))
        mean_whole = float(np.mean(step_ns[whole])) / 1e6
        blame_whole = _blame(df_whole, len(whole), mean_whole, median_phase_ms)
        found = candidates(df_whole, len(whole), blame_whole, ranks, clock_ms, mean_whole, waits)
    else:
        found = candidates(df, n, blame, ranks, clock_ms, mean_step_ms, waits)
    found = _by_stage(found, source, counted_steps)
    tried = [*(extra or []), *(c.change for c in found)]
    whatif = _what_ifs(source, counted_steps, blame, by_op, tried)
    counted_ms = step_ms[counted_at].tolist()
    picked = pick(found, whatif, counted_ms, ranks, explained, waits)
    path.noise_ms = round(noise_ms(counted_ms), 3)
    base_ms = next((w.step_ms for w in whatif if w.change == "none"), 0.0)
    for cause in (picked.cause, picked.straggler):
        if cause is None:
            continue
        if cause.kind == LATE_START and cause.rank is not None:  # (where its rank was)
            cause.before = before(source.segments, source.windows(), cause.rank, whole_steps)
        if cause.then_rank is not None and cause.then_rank != cause.rank:
            # (what the others then wait for)
            cause.then_phase = _own_phase(df, cause.then_rank)  # type: ignore[assignment]
        cause.text = cause_words(cause, base_ms, ranks)
    return Explained(path, per_step, whatif, rank_blame, picked.cause, picked.straggler)


def _by_stage(found: list[Candidate], source: _Source, steps: list[int]) -> list[Candidate]:
    """A rank's own work on a rank that holds several pipeline stages (an interleaved schedule)
    is its slowest stage's: in the candidate's phase, its stage with the most work, where that
    is above the median of every stage's, balanced alone (``balance:stage=K``). Else the rank's
    candidate stands."""
    mine = [c for c in found if c.change.startswith("balance:rank=")]
    if source.actions is None or not mine:
        return found
    held = source.actions.group_by(S.RANK).agg(pl.col(S.STAGE).n_unique().alias("n"))
    several = set(held.filter(pl.col("n") > 1)[S.RANK].to_list())
    if not any(c.rank in several for c in mine):
        return found
    parts = []
    for batch in _batches(source, steps):
        graph = source.graph(batch)
        work = work_by_stage(graph) if graph is not None else None
        if work is not None:
            parts.append(work)
    if not parts:
        return found
    per = pl.concat(parts).group_by(S.RANK, S.STAGE, S.PHASE).agg(pl.col("d").sum())
    out = []
    for c in found:
        if c in mine and c.rank in several:
            phase = per.filter(pl.col(S.PHASE) == c.phase)
            median = phase["d"].median()
            own = phase.filter(pl.col(S.RANK) == c.rank).sort(
                "d", S.STAGE, descending=[True, False]
            )
            if own.height and median is not None and own["d"][0] > median:
                stage = int(own[S.STAGE][0])
                c = dataclasses.replace(c, stage=stage, change=f"balance:stage={stage}")
        out.append(c)
    return out


def _own_phase(rows: pl.DataFrame, rank: int) -> str | None:
    """The phase of ``rank``'s own work with the most time on the paths ``rows`` (None: it
    has none there)."""
    mine = rows.filter(
        (pl.col("rank") == rank)
        & pl.col("kind").is_in(_COMPUTING)
        & ~pl.col("phase").is_in([S.IDLE, S.COMM])
        & pl.col("phase").is_not_null()
    )
    if mine.height == 0:
        return None
    by = (
        mine.group_by("phase")
        .agg(pl.col("ns").sum())
        .sort(["ns", "phase"], descending=[True, False])
    )
    return str(by["phase"][0])
