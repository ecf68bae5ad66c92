"""``summarize``: the run report, section by section (``sections``). ``SECTIONS`` lists them in
the order the report places them: its warnings and remarks come in that order, and a section
that settles a verdict another refines (the pipeline's straggler, then the critical path's)
comes first. Each computes its result once, when first asked for, from the run's inputs and
the sections it asks for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl
import pyarrow.compute as pc

from traceview.analysis.critical_path import NO_STEP, Explained
from traceview.analysis.crossrank import CrossRank, alltoall_ranks, comm_by_group
from traceview.analysis.failure import FailureResult, analyse_failure
from traceview.analysis.fsdp import fsdp_gathers
from traceview.analysis.gpu import counted_launches, gpu_verdict, phase_launches, rank_gpu
from traceview.analysis.groups import Groups
from traceview.analysis.memory import MemoryResults, memory_results
from traceview.analysis.ops import in_steps
from traceview.analysis.pipeline import stage_work
from traceview.analysis.roles import Roles, roles_cause, run_roles
from traceview.analysis.selection import Selection, kept_rows, select_steps
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
    _outside_ops,
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
from traceview.analysis.summary.sections import (
    Context,
    Draft,
    ReportOptions,
    RunInputs,
    Section,
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
from traceview.analysis.summary.verdicts import (
    _cause_verdict,
    _pipeline_verdict,
    _summary,
    _transfer_group,
)
from traceview.analysis.whole_run import whole_run
from traceview.model import schema as S
from traceview.model.results import (
    Clocks,
    FsdpGather,
    GpuVerdict,
    OutsideOp,
    Pipeline,
    RankGpu,
    RankSummary,
    RunInfo,
    RunReport,
    StepStats,
    StepSummary,
    Summary,
    TopOp,
    WholeRun,
)
from traceview.model.results.steps import incomplete_reason

# --- steps: which steps count, and each step across ranks ----------------------------------------


def _roles_section(ctx: Context) -> Roles:
    steps = ctx.inputs.table("steps")
    df = pl.from_arrow(steps) if steps is not None else pl.DataFrame()
    assert isinstance(df, pl.DataFrame)

    def record() -> pl.DataFrame | None:  # (read only for an asynchronous job's staleness)
        read = ctx.inputs.record() if ctx.inputs.record is not None else None
        frame = pl.from_arrow(read[0]) if read is not None else None
        return frame if isinstance(frame, pl.DataFrame) else None

    return run_roles(ctx.manifest, df, record)


def _place_roles(found: Roles, draft: Draft) -> None:
    if found.architecture == "collective":
        return
    for rank in draft.fields["ranks"]:
        rank.role = found.roles.get(rank.rank, "worker")
        rank.busy_fraction = found.busy.get(rank.rank)
        rate = found.rates.get(rank.rank)
        rank.steps_per_s = round(rate, 3) if rate is not None else None
        rank.steps_run = found.ran.get(rank.rank)
        rank.gap_ms = found.gaps.get(rank.rank)
        rank.staleness = found.staleness.get(rank.rank)
    draft.fields["servers"] = found.servers
    summary = draft.fields["summary"]
    cause = roles_cause(found, draft.fields["ranks"])
    if cause is not None or found.synchronous is False:
        summary.cause = cause
    if cause is not None and cause.kind == "dispatch":  # (the share of the workers' time idle)
        summary.bottleneck = "dispatch"
        idle = [1 - b for r, b in found.busy.items() if found.roles.get(r) == "worker"]
        summary.bottleneck_share = round(sum(idle) / len(idle), 4) if idle else 0.0
    if found.synchronous is False:  # nobody waits for anyone: there is no straggler
        summary.straggler_rank, summary.straggler_significant = None, False
        for rank in draft.fields["ranks"]:
            rank.straggler = False
    if found.missing:
        draft.warnings.append(
            f"parameter-server job without a {' or a '.join(found.missing)}'s trace: read as far "
            "as the traces go"
        )
    draft.remarks.append(f"parameter-server job: {found.known_from}")


ROLES = Section("roles", _roles_section, _place_roles)


@dataclass
class Steps:
    every: pl.DataFrame  # every step row of every rank
    incomplete: pl.DataFrame  # the steps some rank did not complete (incomplete_steps)
    complete: pl.DataFrame  # the rows of the steps every rank completed (else every row)
    selection: Selection | None  # the steps the headline figures count (None: every one)
    counted: pl.DataFrame  # the rows of those steps
    per_step: list[StepSummary]
    stats: StepStats | None
    lockstep: bool = True  # every rank's step N is one step of the job

    @property
    def n_counted(self) -> int:
        return sum(1 for s in self.per_step if s.excluded is None)


def _steps(ctx: Context) -> Steps:
    steps = ctx.inputs.table("steps")
    df = pl.from_arrow(steps) if steps is not None else pl.DataFrame()
    assert isinstance(df, pl.DataFrame)
    every = df
    # Steps that did not complete on every rank are left out of every figure (they are listed
    # apart), unless that would leave nothing.
    incomplete = incomplete_steps(df, ctx.manifest, ctx.get(ROLES).synchronous is not False)
    if incomplete.height:
        kept = df.filter(~pl.col(S.STEP).is_in(incomplete[S.STEP].unique().to_list()))
        df = kept if kept.height else df
    # The steps every headline figure counts, decided once over the run (every rank alike).
    # Workers that do not wait for each other number their steps apart: a step is slow (warm-up)
    # against its own worker's pace, each worker's steps scaled to the run's median step.
    lockstep = ctx.get(ROLES).synchronous is not False
    paced = df if lockstep else _own_pace(df)
    selection = select_steps(paced, ctx.options.choice, named_warmup(ctx.manifest))
    per_step, stats = _per_step(df, selection)
    return Steps(
        every, incomplete, df, selection, kept_rows(df, selection), per_step, stats, lockstep
    )


def _own_pace(df: pl.DataFrame) -> pl.DataFrame:
    if df.height == 0:
        return df
    median = df[S.WALL_NS].median()
    own = pl.col(S.WALL_NS).median().over(S.RANK)
    return df.with_columns(
        pl.when(own > 0).then(pl.col(S.WALL_NS) / own * median).otherwise(pl.col(S.WALL_NS))
        .cast(df.schema[S.WALL_NS]).alias(S.WALL_NS)
    )  # fmt: skip


def _place_steps(steps: Steps, draft: Draft) -> None:
    draft.fields.update(
        per_step=steps.per_step,
        step_stats=steps.stats,
        incomplete_steps=_incomplete(
            steps.every, steps.incomplete, sorted(set(steps.every[S.RANK].to_list()))
        )
        if steps.incomplete.height
        else [],
    )
    draft.remarks += [
        *(steps.selection.remarks if steps.selection is not None else []),
        # (a step number is each worker's own where they do not wait for each other)
        *(_slow_remarks(steps.per_step) if steps.lockstep else []),
    ]


STEPS = Section("steps", _steps, _place_steps)

# --- cross: the collectives matched across ranks, over the counted steps -------------------------


@dataclass
class Cross:
    counted: CrossRank | None  # the pass over the counted steps (None: not made)
    every: CrossRank | None  # over every complete step, warm-up included: the critical path's
    groups: Groups
    not_matched: list[str]  # why there is no pass (remarks)


def _cross(ctx: Context) -> Cross:
    if ctx.get(ROLES).synchronous is False:  # nobody waits: no call is matched across workers
        why = "asynchronous parameter server: the workers do not wait for each other, so no call is matched across them"
        return Cross(None, None, groups_of(ctx.manifest), [why])
    every = cross = ctx.inputs.cross
    selection = ctx.get(STEPS).selection
    collectives, comm = ctx.inputs.table("collectives"), ctx.inputs.table("comm")
    if (
        selection is not None
        and selection.excluded
        and collectives is not None
        and comm is not None
    ):
        cross = cross_rank_of(
            ctx.manifest, _kept_table(collectives, selection), _kept_table(comm, selection)
        )
    groups = cross.groups if cross is not None else groups_of(ctx.manifest)
    return Cross(cross, every, groups, _not_matched(ctx.manifest, collectives))


def _place_cross(found: Cross, draft: Draft) -> None:
    cross = found.counted
    draft.fields["groups"] = found.groups.groups
    draft.warnings += [
        *found.groups.warnings,
        *_ungrouped(cross),
        *_unmatched(cross),
        *_no_peer(cross),
    ]
    draft.remarks += found.not_matched


def _collective_fields(ctx: Context) -> dict[str, object]:
    """The report's per-collective, per-group and all-to-all figures over the counted steps."""
    cross, n_steps = ctx.get(CROSS).counted, ctx.get(STEPS).n_counted
    groups = ctx.get(CROSS).groups
    return {
        "collectives": _collectives(cross, n_steps),
        "comm_by_group": comm_by_group(cross.matched, cross.comm, groups, n_steps)
        if cross is not None and cross.comm is not None
        else [],
        "alltoall": alltoall_ranks(cross.matched, n_steps) if cross is not None else [],
    }


def _place_collective_fields(found: dict[str, object], draft: Draft) -> None:
    draft.fields.update(found)


CROSS = Section("cross", _cross, _place_cross)
COLLECTIVES = Section("collectives", _collective_fields, _place_collective_fields)

# --- ranks: each rank's figures over the counted steps, and the run's -----------------------------


#: The formats whose processes are the OS's (a TensorFlow profile's are the profiler's planes)
OS_PIDS = ("kineto", "mxnet", "chainer")


@dataclass
class Ranks:
    ranks: list[RankSummary]
    summary: Summary


def _ranks_section(ctx: Context) -> Ranks:
    counted, cross = ctx.get(STEPS).counted, ctx.get(CROSS).counted
    ranks_df = _rank_rows(counted, cross) if counted.height else pl.DataFrame()
    ranks = _ranks(ranks_df, cross)
    ingested = {r.rank: r for r in ctx.manifest.ranks}
    for rank in ranks:
        entry = ingested.get(rank.rank)
        if entry is not None:
            rank.host, rank.device = entry.host, entry.meta.get("device")
            pid = entry.meta.get("process_id")
            if pid is None and entry.format in OS_PIDS and entry.training_thread:
                pid = entry.training_thread[0]
            rank.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
    return Ranks(ranks, _summary(ranks, ranks_df, cross))


def _place_ranks(found: Ranks, draft: Draft) -> None:
    draft.fields.update(ranks=found.ranks, summary=found.summary)


RANKS = Section("ranks", _ranks_section, _place_ranks)


def _rank_warnings(ctx: Context) -> list[str]:
    return [
        *_ranks_without_steps(ctx.manifest, ctx.get(RANKS).ranks),
        *_inferred_disagree(ctx.manifest),
    ]


def _place_warnings(found: list[str], draft: Draft) -> None:
    draft.warnings += found


RANK_NOTES = Section("rank notes", _rank_warnings, _place_warnings)


def _clocks_section(ctx: Context) -> Clocks | None:
    estimate = _needs_clock_estimate(ctx.manifest)
    return _clocks(ctx.manifest, len(ctx.get(RANKS).ranks), ctx.get(CROSS).counted, estimate)


def _place_clocks(clocks: Clocks | None, draft: Draft) -> None:
    draft.warnings += _clock_warning(clocks)


CLOCKS = Section("clocks", _clocks_section, _place_clocks)

# --- the pipeline, the critical path and the verdicts they settle --------------------------------


def _pipeline_section(ctx: Context) -> tuple[Pipeline | None, list[str]]:
    counted = ctx.get(STEPS).counted[S.STEP].drop_nulls().unique().to_list()
    ops, actions = ctx.inputs.table("ops"), ctx.inputs.table("actions")
    if ops is not None:  # (the stages each rank holds: over the counted steps)
        ops = in_steps(ops, counted)

    def work() -> dict[tuple[int, int], tuple[float, float]]:
        if actions is None or ctx.inputs.segments is None:
            return {}
        return stage_work(actions, ctx.inputs.segments, counted)

    return _pipeline(
        ctx.get(CROSS).counted,
        ctx.inputs.table("collectives"),
        ctx.get(RANKS).ranks,
        ctx.get(CROSS).groups,
        ops,
        work,
    )


def _place_pipeline(found: tuple[Pipeline | None, list[str]], draft: Draft) -> None:
    pipeline, warnings = found
    if pipeline is not None:
        _pipeline_verdict(draft.fields["summary"], draft.fields["ranks"], pipeline)
    draft.fields["pipeline"] = pipeline
    draft.warnings += warnings


PIPELINE = Section("pipeline", _pipeline_section, _place_pipeline)


def _critical_path_section(ctx: Context) -> Explained | None:
    if ctx.get(ROLES).synchronous is False:  # each worker's own pace: no path across them
        return None
    explained = _critical_path(
        ctx.inputs.segments,
        ctx.get(CROSS).every,
        ctx.get(STEPS).per_step,
        ctx.get(RANKS).ranks,
        ctx.options.whatif,
        ctx.manifest.world_size,
        ctx.inputs.path_cache,
        ctx.inputs.table("actions"),
    )
    if explained is not None:  # (exposed transfer: in the group that exposes most of its op)
        by_group = ctx.get(COLLECTIVES)["comm_by_group"]
        _transfer_group(explained, by_group, len(ctx.get(RANKS).ranks))  # type: ignore[arg-type]
    if explained is not None and manifest_steps_from(ctx.manifest) == "one_window":
        # one window holds the one-time costs: no cause of a step is read off it
        explained = dataclasses.replace(explained, cause=None, straggler=None)
    return explained


def _place_critical_path(explained: Explained | None, draft: Draft) -> None:
    if explained is not None:
        for s in draft.fields["per_step"]:
            s.critical_path = explained.per_step.get(NO_STEP if s.step is None else s.step)
        summary, ranks = draft.fields["summary"], draft.fields["ranks"]
        _cause_verdict(summary, ranks, explained, draft.fields["pipeline"])
        path = explained.path
        incomplete = path is not None and path.complete_steps < path.steps
        why = incomplete_reason(draft.fields["per_step"]) if incomplete else ""
        if path is not None and not path.explained:
            draft.remarks.append(
                f"cause: {path.steps - path.complete_steps} of {path.steps} counted steps' "
                "critical paths are incomplete, so only what a rank's own timeline tells is named "
                "(the device waiting for the host, launches, idling, data loading), no late "
                f"start, straggler or transfer; incomplete: {why}"
            )
        elif path is not None and path.complete_steps < path.steps:
            draft.remarks.append(
                f"cause: {path.steps - path.complete_steps} of {path.steps} counted steps' "
                f"critical paths are incomplete: the cause is read off the other "
                f"{path.complete_steps}; incomplete: {why}"
            )
    draft.fields.update(
        critical_path=explained.path if explained is not None else None,
        whatif=explained.whatif if explained is not None else [],
    )


CRITICAL_PATH = Section("critical path", _critical_path_section, _place_critical_path)

# --- the GPU, memory and one-time costs -----------------------------------------------------------


@dataclass
class Gpu:
    ranks: dict[int, RankGpu]
    verdict: GpuVerdict | None


def _gpu_section(ctx: Context) -> Gpu | None:
    gpu, launches = ctx.inputs.table("gpu"), ctx.inputs.table("launches")
    counted, ranks = ctx.get(STEPS).counted, ctx.get(RANKS).ranks
    if gpu is None or launches is None or not counted.height:
        return None
    launched = counted_launches(launches, counted)
    on_gpu = rank_gpu(gpu, launched, counted)
    verdict = gpu_verdict(on_gpu, {r.rank: r.step_ms for r in ranks}, phase_launches(launched))
    if manifest_steps_from(ctx.manifest) == "one_window":
        verdict = None  # one window holds the one-time costs: no per-step advice built on them
    return Gpu(dict(on_gpu), verdict)


def _place_gpu(found: Gpu | None, draft: Draft) -> None:
    if found is None:
        return
    for r in draft.fields["ranks"]:
        r.gpu = found.ranks.get(r.rank)
    draft.fields["gpu_verdict"] = found.verdict


GPU = Section("gpu", _gpu_section, _place_gpu)


def _memory_section(ctx: Context) -> MemoryResults:
    # every complete step, warm-up included (its peaks and growth are memory's own story:
    # allocator growth is what warm-up is), whatever the selection counts
    complete = ctx.get(STEPS).complete
    counted = set(complete[S.STEP].to_list()) if complete.height else None
    since = {r.rank: list(r.meta.get("memory_since_start") or []) for r in ctx.manifest.ranks}
    table = ctx.inputs.table("memory_steps") if "memory" in ctx.inputs.side else None
    ranks = [r.rank for r in ctx.get(RANKS).ranks]
    return memory_results(table, ranks, counted, since, ctx.manifest.framework)


def _place_memory(memory: MemoryResults, draft: Draft) -> None:
    for rank in draft.fields["ranks"]:
        rank.memory = memory.ranks.get(rank.rank)
    draft.fields["summary"].memory = memory.run
    draft.warnings += memory.warnings
    draft.remarks += memory.remarks


MEMORY = Section("memory", _memory_section, _place_memory)


def _startup_section(ctx: Context) -> float | None:
    return _startup_ms(ctx.manifest, [r.rank for r in ctx.get(RANKS).ranks])


def _place_startup(startup_ms: float | None, draft: Draft) -> None:
    draft.fields["summary"].startup_ms = startup_ms


STARTUP = Section("startup", _startup_section, _place_startup)

# --- operators, FSDP, and the run as a whole -----------------------------------------------------


@dataclass
class Operators:
    top: list[TopOp]  # per counted step
    outside: list[OutsideOp]  # outside the counted steps


def _top_ops_section(ctx: Context) -> Operators:
    ops = ctx.inputs.table("ops")
    if ops is None or ops.num_rows == 0:
        return Operators([], [])
    counted, summary = ctx.get(STEPS).counted, ctx.get(RANKS).summary
    steps, top = counted[S.STEP].drop_nulls().unique().to_list(), ctx.options.top
    return Operators(
        _top_ops(ops, steps, counted.height, summary.step_ms, top), _outside_ops(ops, steps, top)
    )


def _place_top_ops(operators: Operators, draft: Draft) -> None:
    draft.fields.update(top_ops=operators.top, outside_ops=operators.outside)


TOP_OPS = Section("top operators", _top_ops_section, _place_top_ops)


def _fsdp_section(ctx: Context) -> list[FsdpGather]:
    """FSDP's all-gathers over the counted steps (``fsdp.fsdp_gathers``)."""
    steps = ctx.get(STEPS)
    collectives, comm = ctx.inputs.table("collectives"), ctx.inputs.table("comm")
    if collectives is None or comm is None or collectives.num_rows == 0:
        return []
    if steps.selection is not None:
        collectives = _kept_table(collectives, steps.selection)
        comm = _kept_table(comm, steps.selection)
    else:
        collectives = collectives.filter(pc.is_valid(collectives.column(S.STEP)))
    return fsdp_gathers(collectives, comm, steps.n_counted)


FSDP = Section("fsdp", _fsdp_section, lambda found, draft: draft.fields.update(fsdp_gathers=found))


def _run_info(ctx: Context) -> RunInfo:
    manifest, complete = ctx.manifest, ctx.get(STEPS).complete
    ranks = ctx.get(RANKS).ranks
    choice = ctx.options.choice
    roles = ctx.get(ROLES)
    return RunInfo(
        framework=manifest.framework,
        ranks=len(ranks),
        steps=int(complete[S.STEP].n_unique())
        if complete.height and complete[S.STEP].null_count() == 0
        else 0,
        world_size=manifest.world_size,
        missing_ranks=manifest.missing_ranks,
        timeline=ranks[0].timeline if ranks else None,
        path=ctx.inputs.path,
        run_id=manifest.run_id,
        job=_job(manifest.collect),
        clocks=ctx.get(CLOCKS),
        steps_from=manifest_steps_from(manifest),
        step_choice=choice.describe() if choice is not None else None,
        architecture=roles.architecture,  # type: ignore[arg-type]
        synchronous=roles.synchronous,
        architecture_from=roles.known_from,
    )


RUN = Section("run", _run_info, lambda run, draft: draft.fields.update(run=run))


def _failure_section(ctx: Context) -> tuple[FailureResult | None, list[str]]:
    read = ctx.inputs.record() if ctx.inputs.record is not None else None
    if read is None:
        return None, []
    steps, calls, ranks, warnings = read
    collect = ctx.manifest.collect
    failed = collect is not None and collect.exit_code not in (None, 0)
    ended = _unix_ns(collect.end) if collect is not None else None
    return analyse_failure(steps, calls, ranks, job_failed=failed, job_end_ns=ended), warnings


def _unix_ns(stamp: str | None) -> int | None:
    """A manifest's time (``2026-12-03T06:28:05+0000``) in UNIX ns; None where it does not read."""
    try:
        return int(datetime.strptime(stamp or "", "%Y-%m-%dT%H:%M:%S%z").timestamp()) * 10**9
    except ValueError:
        return None


def _place_failure(found: tuple[FailureResult | None, list[str]], draft: Draft) -> None:
    result, warnings = found
    draft.warnings += warnings
    if result is not None:
        draft.fields.update(failure=result.failure, ranks_at_end=result.ranks_at_end)


FAILURE = Section("failure", _failure_section, _place_failure)


def _whole_run_section(ctx: Context) -> WholeRun | None:
    read = ctx.inputs.record() if ctx.inputs.record is not None else None
    if read is None:
        return None
    spans = [
        (w.window, w.began_step, w.last_step)
        for w in ctx.inputs.windows
        if w.began_step is not None and w.last_step is not None
    ]
    return whole_run(read[0], spans)


WHOLE_RUN = Section(
    "whole_run", _whole_run_section, lambda found, draft: draft.fields.update(whole_run=found)
)

#: The report's sections in the order it places them. The rank spread comes last: it is of the
#: ranks as the verdicts before it left them.
SECTIONS: tuple[Section[Any], ...] = (
    FAILURE,
    STEPS,
    RANKS,
    RANK_NOTES,
    CROSS,
    PIPELINE,
    CLOCKS,
    CRITICAL_PATH,
    ROLES,
    GPU,
    MEMORY,
    STARTUP,
    TOP_OPS,
    COLLECTIVES,
    FSDP,
    WHOLE_RUN,
    RUN,
)


def summarize(inputs: RunInputs, options: ReportOptions | None = None) -> RunReport:
    """The report of a run (``report --json``, docs/design.md): each section computed from
    ``inputs`` and placed, in ``SECTIONS``' order."""
    context = Context(inputs, options or ReportOptions())
    draft = Draft(warnings=list(inputs.manifest.notes.warnings))
    draft.remarks += inputs.manifest.notes.remarks
    for section in SECTIONS:
        section.place(context.get(section), draft)
    return RunReport(
        **draft.fields,
        rank_spread=rank_spread(draft.fields["ranks"]),
        warnings=draft.warnings,
        remarks=draft.remarks,
    )
