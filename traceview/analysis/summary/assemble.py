"""``summarize``: the run report assembled from its parts, in the order the verdicts need them."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path import PathCache
from traceview.analysis.crossrank import CrossRank, alltoall_ranks, comm_by_group
from traceview.analysis.gpu import gpu_verdict, phase_launches, rank_gpu
from traceview.analysis.memory import memory_results
from traceview.analysis.selection import StepChoice, kept_rows, select_steps
from traceview.analysis.summary.notes import (
    _clock_warning,
    _clocks,
    _needs_clock_estimate,
    _no_peer,
    _not_matched,
    _ungrouped,
    _unmatched,
)
from traceview.analysis.summary.parts import (
    _collectives,
    _critical_path,
    _fsdp,
    _pipeline,
    _top_ops,
    cross_rank_of,
    groups_of,
)
from traceview.analysis.summary.ranks import (
    _job,
    _rank_rows,
    _ranks,
    _ranks_without_steps,
    rank_spread,
)
from traceview.analysis.summary.steps import (
    _incomplete,
    _inferred_disagree,
    _kept_table,
    _per_step,
    _slow_remarks,
    _startup_ms,
    incomplete_steps,
    manifest_steps_from,
    named_warmup,
)
from traceview.analysis.summary.verdicts import _blame_verdict, _pipeline_verdict, _summary
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.manifest import Manifest
from traceview.model.results import RunInfo, RunReport


def summarize(
    steps: pa.Table,
    ops: pa.Table,
    manifest: Manifest,
    top: int = 10,
    *,
    path: str | None = None,
    collectives: pa.Table | None = None,
    cross: CrossRank | None = None,
    gpu: pa.Table | None = None,
    launches: pa.Table | None = None,
    memory_steps: pa.Table | None = None,
    choice: StepChoice | None = None,
    comm: pa.Table | None = None,
    segments: TableOnDemand | None = None,
    whatif: list[str] | None = None,
    path_cache: PathCache | None = None,
) -> RunReport:
    """The report of a run (``report --json``, docs/design.md) from its per-rank tables;
    ``path``: the run directory, where it is not a temporary one; ``cross``: the cross-rank pass
    (``cross_rank_of``; without it wait and transfer are null), ``collectives``: the calls it
    was made from (to say why there is none); ``gpu``, ``launches``: the GPU tables
    (analysis/gpu.py; without them ``ranks[].gpu`` is null); ``memory_steps``: the per-rank
    memory figures (None: the run has no memory table); ``choice``: the steps --steps/--skip
    chose (None: leading warm-up steps left out, ``selection``); ``comm``: the run's comm table,
    for the cross-rank pass over the selected steps where some are left out (without it,
    ``cross`` is used as it is); ``segments``: the ranks' timelines as segments, for the
    critical path (None: an older run directory; no critical path, no what-ifs); ``whatif``:
    changes to replay besides the report's own (WhatIf.change); ``path_cache``: where the
    critical path of an earlier report of the same run and steps is kept."""
    df = pl.from_arrow(steps)
    assert isinstance(df, pl.DataFrame)
    all_steps = df
    # Steps that did not complete on every rank are left out of every figure (they are listed
    # apart), unless that would leave nothing.
    incomplete = incomplete_steps(df, manifest)
    if incomplete.height:
        kept = df.filter(~pl.col(S.STEP).is_in(incomplete[S.STEP].unique().to_list()))
        df = kept if kept.height else df
    # The steps every headline figure counts, decided once over the run (every rank alike).
    selection = select_steps(df, choice, named_warmup(manifest))
    complete_df = df
    df = kept_rows(df, selection)
    every_step_cross = cross  # (the critical path of each complete step, warm-up included)
    if (
        selection is not None
        and selection.excluded
        and collectives is not None
        and comm is not None
    ):
        cross = cross_rank_of(
            manifest, _kept_table(collectives, selection), _kept_table(comm, selection)
        )
    estimate = _needs_clock_estimate(manifest)
    ranks_df = _rank_rows(df, cross) if df.height else pl.DataFrame()
    ranks = _ranks(ranks_df, cross)
    clocks = _clocks(manifest, len(ranks), cross, estimate)
    summary = _summary(ranks, ranks_df, cross)
    groups = cross.groups if cross is not None else groups_of(manifest)
    pipeline, pipeline_warnings = _pipeline(cross, collectives, ranks, groups, ops)
    if pipeline is not None:
        _pipeline_verdict(summary, ranks, pipeline)
    per_step, stats = _per_step(complete_df, selection)
    explained = _critical_path(
        segments, every_step_cross, per_step, ranks, whatif or [], manifest.world_size, path_cache
    )
    if explained is not None:
        _blame_verdict(summary, ranks, explained)
    verdict = None
    if gpu is not None and launches is not None and df.height:
        on_gpu = rank_gpu(gpu, launches, df)
        for r in ranks:
            r.gpu = on_gpu.get(r.rank)
        verdict = gpu_verdict(
            on_gpu, {r.rank: r.step_ms for r in ranks}, phase_launches(gpu, launches)
        )
    # memory: every complete step, warm-up included (its peaks and growth are memory's own
    # story: allocator growth is what warm-up is), whatever the selection counts
    complete = set(complete_df[S.STEP].to_list()) if complete_df.height else None
    since = {r.rank: list(r.meta.get("memory_since_start") or []) for r in manifest.ranks}
    memory = memory_results(
        memory_steps, [r.rank for r in ranks], complete, since, manifest.framework
    )
    for rank in ranks:
        rank.memory = memory.ranks.get(rank.rank)
    summary.memory = memory.run
    summary.startup_ms = _startup_ms(manifest, [r.rank for r in ranks])
    steps_from = manifest_steps_from(manifest)
    if steps_from == "one_window":
        verdict = None  # one window holds the one-time costs: no per-step advice built on them
    return RunReport(
        run=RunInfo(
            framework=manifest.framework,
            ranks=len(ranks),
            steps=int(complete_df[S.STEP].n_unique())
            if complete_df.height and complete_df[S.STEP].null_count() == 0
            else 0,
            world_size=manifest.world_size,
            missing_ranks=manifest.missing_ranks,
            timeline=ranks[0].timeline if ranks else None,
            path=path,
            run_id=manifest.run_id,
            job=_job(manifest.collect),
            clocks=clocks,
            steps_from=steps_from,
            step_choice=choice.describe() if choice is not None else None,
        ),
        summary=summary,
        ranks=ranks,
        rank_spread=rank_spread(ranks),
        per_step=per_step,
        step_stats=stats,
        top_ops=_top_ops(ops, int(all_steps.height), summary.step_ms, top),
        warnings=[
            *manifest.notes.warnings,
            *_ranks_without_steps(manifest, ranks),
            *groups.warnings,
            *_ungrouped(cross),
            *_inferred_disagree(manifest),
            *_unmatched(cross),
            *_no_peer(cross),
            *pipeline_warnings,
            *_clock_warning(clocks),
            *memory.warnings,
        ],
        remarks=[
            *manifest.notes.remarks,
            *(selection.remarks if selection is not None else []),
            *_slow_remarks(per_step),
            *_not_matched(manifest, collectives),
            *memory.remarks,
        ],
        collectives=_collectives(cross, sum(1 for s in per_step if s.excluded is None)),
        incomplete_steps=_incomplete(
            all_steps, incomplete, sorted(set(all_steps[S.RANK].to_list()))
        )
        if incomplete.height
        else [],
        gpu_verdict=verdict,
        groups=groups.groups,
        pipeline=pipeline,
        comm_by_group=comm_by_group(
            cross.matched, cross.comm, groups, sum(1 for s in per_step if s.excluded is None)
        )
        if cross is not None and cross.comm is not None
        else [],
        critical_path=explained.path if explained is not None else None,
        whatif=explained.whatif if explained is not None else [],
        alltoall=alltoall_ranks(cross.matched, sum(1 for s in per_step if s.excluded is None))
        if cross is not None
        else [],
        fsdp_gathers=_fsdp(
            collectives, comm, selection, sum(1 for s in per_step if s.excluded is None)
        ),
    )
