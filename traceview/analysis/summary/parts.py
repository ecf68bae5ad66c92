"""The report's parts that other analyses compute: collectives, FSDP gathers, the pipeline, the
cross-rank pass, the critical path and its explanation, the top operators."""

from __future__ import annotations

import json
from collections.abc import Callable

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.critical_path import PATH_VERSION, Explained, PathCache, explain
from traceview.analysis.crossrank import (
    CrossRank,
    Matched,
    bus_bandwidth_gbps,
    collective_rows,
    cross_rank,
    global_peer,
    launch_views,
    match_collectives,
)
from traceview.analysis.groups import Groups, declared_groups
from traceview.analysis.ops import in_steps
from traceview.analysis.pipeline import POINT_TO_POINT, annotated_stages, detect_pipeline
from traceview.analysis.summary.notes import _needs_clock_estimate
from traceview.analysis.summary.units import _exact_ms, _median, _ms, _round
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.manifest import Manifest
from traceview.model.results import (
    CollectiveSummary,
    OutsideOp,
    Pipeline,
    RankSummary,
    StepSummary,
    TopOp,
)


def _operators(ops: pa.Table) -> pl.DataFrame:
    """The rows of operators and device activities (regions hold waits, not work)."""
    df = pl.from_arrow(ops)
    assert isinstance(df, pl.DataFrame)
    return df.filter(pl.col(S.KIND).is_in([S.KIND_OP, *S.DEVICE_ACTIVITY_KINDS]))


def _by_operator(rows: pl.DataFrame, top: int) -> pl.DataFrame:
    return (
        rows.group_by(S.DEVICE, S.PHASE, S.OP, maintain_order=True)
        .agg(
            pl.col(S.NAME).first(),
            pl.col(S.COUNT).sum(),
            pl.col(S.TOTAL_NS).sum(),
            pl.col(S.SELF_NS).sum(),
            pl.col(S.P95_NS).max(),
        )
        # (ties in self time: in the ops table's order, the same in every report)
        .sort(S.SELF_NS, descending=True, maintain_order=True)
        .head(top)
    )


def _top_ops(
    ops: pa.Table, counted: list[int], rank_steps: int, step_ms: float, top: int
) -> list[TopOp]:
    """The operators of the counted steps, per rank and step (``rank_steps``: the counted
    steps' rows in the steps table, a row per rank and step). A run whose operators carry no
    step (one window) counts them all over its one window per rank."""
    operators = _operators(in_steps(ops, counted))
    n_steps = max(rank_steps, 1)
    top_ops = []
    for row in _by_operator(operators, top).iter_rows(named=True):
        calls = round(row[S.COUNT] / n_steps, 2)
        total = _ms(row[S.TOTAL_NS] / n_steps)
        self_ms = _ms(row[S.SELF_NS] / n_steps)
        top_ops.append(
            TopOp(
                op=row[S.OP],
                name=row[S.NAME],
                device=row[S.DEVICE],
                phase=row[S.PHASE],
                calls_per_step=calls,
                self_ms_per_step=self_ms,
                total_ms_per_step=total,
                p95_ms=_ms(row[S.P95_NS]),
                mean_ms=_ms(row[S.TOTAL_NS] / row[S.COUNT]) if row[S.COUNT] else 0.0,
                share=round(self_ms / step_ms, 4) if step_ms > 0 else 0.0,
            )
        )
    return top_ops


def _outside_ops(ops: pa.Table, counted: list[int], top: int) -> list[OutsideOp]:
    """The operators outside the counted steps (set-up before the first step, the warm-up
    steps, teardown), mean of the ranks; none where no operator carries a step (one window:
    everything is its step)."""
    step = ops.column(S.STEP)
    if step.null_count == ops.num_rows:
        return []
    ranks = max(pc.count_distinct(ops.column(S.RANK)).as_py(), 1)
    outside = ops.filter(
        pc.invert(pc.fill_null(pc.is_in(step, pa.array(counted, pa.int64())), False))
    )
    outside = _operators(outside)
    return [
        OutsideOp(
            op=row[S.OP],
            name=row[S.NAME],
            device=row[S.DEVICE],
            phase=row[S.PHASE],
            calls=round(row[S.COUNT] / ranks, 2),
            self_ms=_ms(row[S.SELF_NS] / ranks),
            total_ms=_ms(row[S.TOTAL_NS] / ranks),
        )
        for row in _by_operator(outside, top).iter_rows(named=True)
    ]


def _collectives(cross: CrossRank | None, n_steps: int) -> list[CollectiveSummary]:
    if cross is None or not cross.available:
        return []
    ranks_of = cross.groups.ranks_of
    return [
        CollectiveSummary(
            op=row[S.COLLECTIVE],
            name=row[S.NAME],
            group=row[S.GROUP],
            position=row["position"],
            calls_per_step=round(row["calls_per_step"], 3),
            ranks=row["ranks"],
            bytes=row[S.BYTES],
            transfer_ms=_exact_ms(row["transfer_ns"]),
            wait_ms=_exact_ms(row["wait_ns"]),
            skew_ms=_exact_ms(row["skew_ns"]),
            last_rank=row["last_rank"],
            algorithm=row["algorithm"],
            busbw_gbps=_round(
                bus_bandwidth_gbps(
                    row[S.COLLECTIVE], row["ranks"], row[S.BYTES], row["transfer_ns"]
                )
            ),
            group_ranks=ranks_of.get(row[S.GROUP]) if row[S.GROUP] is not None else None,
            queued_ms=_exact_ms(row["queued_ns"]),
        )
        for row in collective_rows(cross.matched, n_steps).iter_rows(named=True)
    ]


def _pipeline(
    cross: CrossRank | None,
    collectives: pa.Table | None,
    ranks: list[RankSummary],
    groups: Groups,
    ops: pa.Table | None = None,
    work: Callable[[], dict[tuple[int, int], tuple[float, float]]] | None = None,
) -> tuple[Pipeline | None, list[str]]:
    """The pipeline the point-to-point calls form, and its warnings. Where ranks are missing (no
    cross-rank pass), the pairs between the ranks read are matched on their own: a pair's wait
    depends on its two sides only. ``ops``: where the pipelining library names its actions,
    the stages each rank holds; ``work``: where a rank holds several, each stage's own work
    (``pipeline.stage_work``), asked for only then."""
    table = cross.calls if cross is not None and cross.calls is not None else collectives
    if table is None or table.num_rows == 0:
        return None, []
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    p2p = df.filter(pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT))
    if p2p.height == 0:
        return None, []
    # each call once: where it runs, not where it was launched (c10d::send and gloo:send)
    p2p = p2p.join(launch_views(p2p), on=[S.NAME, S.COLLECTIVE], how="anti")
    named = global_peer(p2p.filter(pl.col(S.PEER).is_not_null()), groups).select(
        S.RANK, pl.col("_peer").alias("peer_rank")
    )
    if cross is not None:
        calls = cross.matched.calls
    else:
        calls = match_collectives(p2p.to_arrow(), groups).calls
    annotated = None
    if ops is not None and ops.num_rows:
        frame = pl.from_arrow(ops)
        assert isinstance(frame, pl.DataFrame)
        annotated = annotated_stages(frame)
        if work is not None and any(len(v.stages) > 1 for v in annotated.values()):
            own = work()
            for rank, held in annotated.items():
                held.work_ms = {k: own.get((rank, k), (0.0, 0.0)) for k in held.stages}
    return detect_pipeline(calls, ranks, named, annotated)


def cross_rank_of(
    manifest: Manifest, collectives: pa.Table | None, comm: pa.Table | None
) -> CrossRank | None:
    """The cross-rank pass over a run's per-rank tables, its clocks estimated where they may
    differ; None where a rank is missing (the last to arrive may be the one not read)."""
    if collectives is None or comm is None or manifest.missing_ranks:
        return None
    return cross_rank(
        collectives,
        comm,
        align_clocks=_needs_clock_estimate(manifest),
        groups=groups_of(manifest),
    )


def groups_of(manifest: Manifest) -> Groups:
    """The process groups the run's ranks declare."""
    declared = {r.rank: list(r.meta.get("process_groups") or []) for r in manifest.ranks}
    return declared_groups(declared, manifest.world_size)


def _critical_path(
    segments: TableOnDemand | None,
    cross: CrossRank | None,
    per_step: list[StepSummary],
    ranks: list[RankSummary],
    whatif: list[str],
    world: int | None,
    cache: PathCache | None,
    actions: pa.Table | None = None,
) -> Explained | None:
    """The critical path of the counted steps (analysis/critical_path/); ``cache``: where an
    earlier report of this run kept it; ``actions``: a pipeline's."""
    counted = [s.step for s in per_step if s.excluded is None]
    every = [s.step for s in per_step]
    if segments is None or segments.num_rows == 0 or not counted or not ranks:
        return None
    # late starts within the clocks' uncertainty (estimated from collectives) are not a cause
    clock_ms = cross.clocks.residual_ns / 1e6 if cross is not None and cross.clocks else 0.0
    key = json.dumps([PATH_VERSION, every, counted, whatif, world, clock_ms])
    explained = cache.get(key) if cache is not None else None
    if explained is None:
        explained = _explain(
            segments, cross, ranks, every, counted, whatif, world, clock_ms, actions
        )
        if cache is not None:
            cache.put(key, explained)
    return explained


def _explain(
    segments: TableOnDemand,
    cross: CrossRank | None,
    ranks: list[RankSummary],
    every: list[int | None],
    counted: list[int | None],
    whatif: list[str],
    world: int | None,
    clock_ms: float = 0.0,
    actions: pa.Table | None = None,
) -> Explained:
    """``explain`` of the segments, read a piece at a time: nothing here holds them whole."""
    if cross is not None and cross.clocks is not None:  # on the clock the calls were matched on
        segments = cross.clocks.shifted_segments(segments)
        if actions is not None:
            frame = pl.from_arrow(actions)
            assert isinstance(frame, pl.DataFrame)
            actions = cross.clocks.shift(frame, S.START_NS, S.END_NS).to_arrow()
    matched = cross.matched if cross is not None else Matched(pl.DataFrame())
    median_phase = {
        phase: _median([getattr(r.breakdown_ms, phase) for r in ranks])
        for phase in S.BREAKDOWN_PHASES
    }
    n = len(ranks)
    waited_for = {r.rank: r.caused_wait_ms / (n - 1) for r in ranks if r.caused_wait_ms and n > 1}
    return explain(
        segments, matched, every, counted, median_phase, whatif, world, clock_ms, actions,
        waited_for,
    )  # fmt: skip
