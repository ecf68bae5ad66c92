"""Pipelines: stages found from the point-to-point chain, and how much of each stage's step is
bubble.

Stages. Ranks that exchange point-to-point messages form chains: a pipeline of p stages is a
path of p ranks (one path per data-parallel replica), each rank talking to its neighbours only.
The end of a path whose first call in a step is a send is stage 0 (it runs the first forward and
hands its activations on); stage k of the pipeline is the k-th rank of every path. Micro-batches
per step: stage 0's sends to stage 1 per step. The schedule is GPipe when every stage finishes its
forwards' messages before its first backward message, else 1F1B.

Virtual stages. torch.distributed.pipelining's multi-stage schedules (interleaved 1F1B, looped
BFS, the zero-bubble ones) put several stages on each rank and name every action they run
(``PP:<stage><F|B|I|W><micro-batch>``). Where a rank holds more than one stage, the ranks
(pipeline positions) are ordered by the lowest stage each holds, the micro-batches are the
actions' own, and the messages (which go round a ring of ranks, or both ways between two) are
not needed to find them. The schedule is "interleaved", or "zero-bubble" where the backward is
split into input and weight gradients (I and W actions); the ideal bubble of an interleaved
schedule with v stages per rank is (p - 1) / (v m + p - 1); a zero-bubble schedule's depends on
the split, and is not given.

Bubble. A stage's step is its compute (forward, backward, update), its data loading, its
collectives (a data-parallel all-reduce across replicas), its other work (``zero_grad``, Python
between phases), and the rest: time the stage is blocked
on its neighbours (in a receive, or a send not yet taken), which is bubble, never the stage's own
work. ``transfer_ms`` is the part of the bubble in which the stage's incoming messages were moving
(from when both sides had issued them until they arrived, and no more than the time the stage
was blocked after both had: its exposed transfer): on one host, small messages move in
well under a millisecond, and the bubble is waiting. The bubble fraction is the stages' bubble
over their step time, beside the schedule's ideal for equal stages with free messages:
(p - 1) / (m + p - 1) for GPipe and 1F1B alike.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import TableOnDemand, dictionary_codes, ints
from traceview.model.results import Pipeline, PipelineStage, RankSummary, StragglerPhase

POINT_TO_POINT = ("send", "recv")
_PHASES: tuple[StragglerPhase, ...] = ("forward", "backward")

#: torch.distributed.pipelining's name for a computation it runs: stage, action, micro-batch
_ACTION = re.compile(r"PP:(\d+)(F|B|I|W)(\d+)")


@dataclass
class VirtualStages:
    """What a rank's pipelining annotations say: the stages it holds, the micro-batches, and
    whether its backward is split (zero bubble)."""

    stages: tuple[int, ...]
    microbatches: int
    split: bool
    # per stage it holds: its actions' time per step in ms, forward (F) and backward (B, I, W)
    work_ms: dict[int, tuple[float, float]] = field(default_factory=dict)


def actions_part(events: pa.Table, counted: np.ndarray | None = None) -> pa.Table:
    """The pipeline actions (schema.ACTIONS_SCHEMA) among the rows of ``events`` where
    ``counted`` (default: all): their ``PP:`` regions, read off the names' dictionary."""
    if events.num_rows == 0:
        return S.empty(S.ACTIONS_SCHEMA)
    codes, names = dictionary_codes(events.column(S.NAME))
    # (every chunk of every rank comes here: only the names that may be actions are parsed)
    maybe = pc.fill_null(pc.starts_with(pa.array(names, pa.string()), "PP:"), False)
    parsed: list[re.Match[str] | None] = [None] * len(names)
    known = np.zeros(len(names) + 1, bool)  # (the last: a null name's code, -1)
    for i in np.flatnonzero(np.asarray(maybe, bool)).tolist():
        parsed[i] = _ACTION.fullmatch(str(names[i]))
        known[i] = parsed[i] is not None
    mine = known[codes]
    if counted is not None:
        mine &= counted
    rows = np.flatnonzero(mine)
    if not len(rows):
        return S.empty(S.ACTIONS_SCHEMA)
    found = [parsed[c] for c in codes[rows].tolist()]
    start = ints(events.column(S.TS_NS), 0)[rows]
    return S.conform(
        pa.table(
            {
                S.RANK: events.column(S.RANK).take(pa.array(rows)),
                S.STEP: events.column(S.STEP).take(pa.array(rows)),
                S.STAGE: pa.array([int(m[1]) for m in found if m], pa.int32()),
                S.ACTION: pa.array([m[2] for m in found if m], pa.string()),
                S.MICROBATCH: pa.array([int(m[3]) for m in found if m], pa.int32()),
                S.START_NS: start,
                S.END_NS: start + ints(events.column(S.DUR_NS), 0)[rows],
            }
        ),
        S.ACTIONS_SCHEMA,
    )


#: The segments that are a stage's own work: the host computing (CPU timelines), the device
#: running kernels, or waiting while the host launches them (GPU timelines).
_WORK_KINDS = (S.SEGMENT_COMPUTE, S.SEGMENT_KERNEL, S.SEGMENT_HOST_BOUND, S.SEGMENT_LAUNCH)


def stage_work(
    actions: pa.Table, segments: TableOnDemand, steps: list[int]
) -> dict[tuple[int, int], tuple[float, float]]:
    """(rank, stage) -> the stage's own work per step in ms, forward and backward: the rank's
    work segments (``_WORK_KINDS``) inside the stage's actions, over ``steps``. A region of an
    action also holds its waits (the schedule waits for a micro-batch's input inside its
    forward action): those are not the stage's work. On GPU timelines a kernel counts where it
    runs, which may be after the action that launched it."""
    acts = pl.from_arrow(actions)
    assert isinstance(acts, pl.DataFrame)
    if acts[S.STEP].null_count() < acts.height:  # (else one window: its one step)
        acts = acts.filter(pl.col(S.STEP).is_in(steps))
    if acts.height == 0:
        return {}
    n_steps = dict(acts.group_by(S.RANK).agg(pl.col(S.STEP).n_unique()).iter_rows())
    acts = acts.select(
        S.RANK,
        pl.col(S.START_NS).alias("_at"),
        pl.col(S.END_NS).alias("_until"),
        S.STAGE,
        (pl.col(S.ACTION) == "F").alias("_forward"),
    ).sort(S.RANK, "_at")
    ranks = acts[S.RANK].unique().to_list()
    totals: list[pl.DataFrame] = []
    for piece in segments.in_pieces():
        df = pl.from_arrow(piece)
        assert isinstance(df, pl.DataFrame)
        df = df.filter(
            pl.col(S.KIND).cast(pl.String).is_in(_WORK_KINDS) & pl.col(S.RANK).is_in(ranks)
        ).sort(S.RANK, S.START_NS)
        if df.height == 0:
            continue
        inside = df.join_asof(
            acts, left_on=S.START_NS, right_on="_at", by=S.RANK, check_sortedness=False
        )
        overlap = (
            pl.min_horizontal(S.END_NS, "_until") - pl.max_horizontal(S.START_NS, "_at")
        ).clip(lower_bound=0)
        totals.append(
            inside.filter(pl.col(S.STAGE).is_not_null())
            .group_by(S.RANK, S.STAGE, "_forward")
            .agg(overlap.sum().alias("_ns"))
        )
    if not totals:
        return {}
    summed = pl.concat(totals).group_by(S.RANK, S.STAGE, "_forward").agg(pl.col("_ns").sum())
    out: dict[tuple[int, int], tuple[float, float]] = {}
    for rank, stage, forward, ns in summed.iter_rows():
        f, b = out.get((rank, stage), (0.0, 0.0))
        ms = ns / 1e6 / n_steps[rank]
        out[(int(rank), int(stage))] = (f + ms, b) if forward else (f, b + ms)
    return out


def annotated_stages(ops: pl.DataFrame) -> dict[int, VirtualStages]:
    """Per rank, the pipeline stages its ``PP:`` action regions name (the ops table's names,
    over the steps it holds: a report's counted ones), and each stage's own work per step."""
    if ops.height == 0:
        return {}
    actions = (
        ops.select(S.RANK, S.STEP, pl.col(S.NAME).cast(pl.String), S.TOTAL_NS)
        .filter(pl.col(S.NAME).str.starts_with("PP:"))
        .with_columns(pl.col(S.NAME).str.extract_groups(_ACTION.pattern).alias("_a"))
        .unnest("_a")
        .filter(pl.col("1").is_not_null() & pl.col(S.NAME).str.contains(f"^{_ACTION.pattern}$"))
        .with_columns(pl.col("1").cast(pl.Int64).alias("_stage"))
    )
    per_rank = actions.group_by(S.RANK).agg(
        pl.col("_stage").unique().sort().alias("stages"),
        pl.col("3").n_unique().alias("batches"),
        pl.col("2").is_in(["I", "W"]).any().alias("split"),
        pl.col(S.STEP).n_unique().alias("steps"),  # (a null: one window, one step)
    )
    work = actions.group_by(S.RANK, "_stage").agg(
        pl.col(S.TOTAL_NS).filter(pl.col("2") == "F").sum().alias("f"),
        pl.col(S.TOTAL_NS).filter(pl.col("2") != "F").sum().alias("b"),
    )
    out = {}
    for rank, stages, batches, split, steps in per_rank.iter_rows():
        mine = work.filter(pl.col(S.RANK) == rank)
        per_step = 1e-6 / max(int(steps), 1)
        held = {int(k): (f * per_step, b * per_step) for _, k, f, b in mine.iter_rows()}
        out[int(rank)] = VirtualStages(tuple(stages), int(batches), bool(split), held)
    return out


def _chains(edges: set[tuple[int, int]]) -> list[list[int]] | None:
    """The paths the undirected edges form (each from its lower end), or None where they do
    not form paths (a rank with three neighbours, a ring)."""
    neighbours: dict[int, set[int]] = {}
    for a, b in edges:
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    if any(len(n) > 2 for n in neighbours.values()):
        return None
    seen: set[int] = set()
    chains = []
    for start in sorted(r for r, n in neighbours.items() if len(n) == 1):
        if start in seen:
            continue
        chain = [start]
        seen.add(start)
        while True:
            nxt = [r for r in neighbours[chain[-1]] if r not in seen]
            if not nxt:
                break
            chain.append(nxt[0])
            seen.add(nxt[0])
        chains.append(chain)
    if len(seen) != len(neighbours):  # a ring: no ends
        return None
    return chains


def detect_pipeline(
    calls: pl.DataFrame,
    ranks: list[RankSummary],
    named: pl.DataFrame | None = None,
    annotated: dict[int, VirtualStages] | None = None,
) -> tuple[Pipeline | None, list[str]]:
    """The pipeline the matched point-to-point ``calls`` form (``Matched.calls`` with
    ``peer_rank``), with each stage's figures from the ranks' breakdowns (None without one), and
    a warning where stages are missing. ``named``: (rank, peer_rank) of every point-to-point
    call read, matched or not: a stage whose rank has no trace (or no steps) is known only from
    the peers its neighbours name; the other stages are analysed without it. ``annotated``:
    the ranks' pipelining annotations (``annotated_stages``), which place virtual stages."""
    if calls.height == 0 or "peer_rank" not in calls.columns:
        return None, []
    p2p = calls.filter(
        pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT) & pl.col("peer_rank").is_not_null()
    )
    if p2p.height == 0:
        return None, []
    if annotated and any(len(v.stages) > 1 for v in annotated.values()):
        return _virtual_pipeline(p2p, calls, ranks, annotated)
    seen = p2p.select(S.RANK, "peer_rank")
    if named is not None:
        seen = pl.concat([seen, named.select(S.RANK, "peer_rank")], how="vertical_relaxed")
    pairs = seen.select(
        pl.min_horizontal(S.RANK, "peer_rank").alias("a"),
        pl.max_horizontal(S.RANK, "peer_rank").alias("b"),
    ).unique()
    chains = _chains({(int(a), int(b)) for a, b in pairs.iter_rows() if a != b})
    if not chains or len({len(c) for c in chains}) != 1 or len(chains[0]) < 2:
        return None, []
    by_rank = {r.rank: r for r in ranks}
    # orient each chain: activations flow from stage 0, so a rank's first call in a step is a
    # send to the next stage (stage 0) or a receive from the previous one
    first = (
        p2p.sort("issued")
        .group_by(S.RANK, "step_key")
        .agg(pl.col(S.COLLECTIVE).first().alias("first"), pl.col("peer_rank").first())
    )
    place = {r: (c, i) for c in chains for i, r in enumerate(c)}
    votes = {id(c): 0 for c in chains}
    for rank, _, op, peer in first.iter_rows():
        chain, i = place.get(rank, (None, 0))
        if chain is None:
            continue
        after = i + 1 < len(chain) and chain[i + 1] == peer
        before = i > 0 and chain[i - 1] == peer
        if (op == "send" and after) or (op == "recv" and before):
            votes[id(chain)] += 1
        elif (op == "send" and before) or (op == "recv" and after):
            votes[id(chain)] -= 1
    chains = [c if votes[id(c)] >= 0 else c[::-1] for c in chains]
    p = len(chains[0])
    missing = sorted({(k, c[k]) for c in chains for k in range(p) if c[k] not in by_rank})
    steps = max(p2p["step_key"].n_unique(), 1)
    # micro-batches: a stage's sends to the next per step (the first such pair that was read)
    head, second = next(
        ((c[k], c[k + 1]) for c in chains for k in range(p - 1)
         if c[k] in by_rank and c[k + 1] in by_rank),
        (chains[0][0], chains[0][1]),
    )  # fmt: skip
    forward_sends = p2p.filter(
        (pl.col(S.RANK) == head)
        & (pl.col(S.COLLECTIVE) == "send")
        & (pl.col("peer_rank") == second)
    )
    m = forward_sends.height / steps
    moved, collective = _moved_and_collective(p2p, calls, steps)
    stages = []
    for k in range(p):
        members = [c[k] for c in chains if c[k] in by_rank]
        if members:
            stages.append(_stage(k, members, by_rank, moved, collective))
    warnings = []
    if missing:
        unmatched = (
            named.filter(pl.col("peer_rank").is_in([r for _, r in missing])).height
            if named is not None
            else 0
        )
        listed = ", ".join(f"stage {k} (rank {r})" for k, r in missing[:10])
        more = " ..." if len(missing) > 10 else ""
        warnings.append(
            f"pipeline: {len(missing)} of {p * len(chains)} stage rank(s) have no trace or no "
            f"steps ({listed}{more}); {unmatched} point-to-point call(s) with them are "
            "unmatched; the other stages are analysed without them"
        )
    if len(stages) < 2:
        return None, warnings
    ideal = round((p - 1) / (m + p - 1), 6) if m > 0 else 0.0
    return _pipeline(stages, by_rank, m, _schedule(p2p, chains), ideal, p), warnings


def _moved_and_collective(
    p2p: pl.DataFrame, calls: pl.DataFrame, steps: int
) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank, ms per step: its incoming messages' transfer, and its collectives' time."""
    per_step = 1e-6 / steps
    arriving = (
        p2p.filter(pl.col(S.COLLECTIVE) == "recv").group_by(S.RANK).agg(pl.col("transfer_ns").sum())
    )
    others = (
        calls.filter(~pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT))
        .group_by(S.RANK)
        .agg((pl.col(S.END_NS) - pl.col("issued")).sum())
    )
    return (
        {r: t * per_step for r, t in arriving.iter_rows()},
        {r: t * per_step for r, t in others.iter_rows()},
    )


def _pipeline(
    stages: list[PipelineStage],
    by_rank: dict[int, RankSummary],
    m: float,
    schedule: Schedule,
    ideal: float | None,
    depth: int,
    virtual: int = 1,
) -> Pipeline:
    slowest = max(stages, key=lambda s: s.compute_ms)
    slowest_phase, ratio = _slowest_phase(slowest, stages, by_rank)
    step_total = sum(by_rank[r].step_ms for s in stages for r in s.ranks)
    bubble_total = sum(s.bubble_ms * len(s.ranks) for s in stages)
    return Pipeline(
        stages=stages,
        microbatches=round(m, 3),
        schedule=schedule,
        bubble_fraction=round(bubble_total / step_total, 4) if step_total > 0 else 0.0,
        ideal_bubble_fraction=ideal,
        slowest_stage=slowest.stage,
        slowest_phase=slowest_phase,
        slowest_phase_ratio=ratio,
        stage_count=depth,
        virtual_stages=virtual,
    )


def _virtual_pipeline(
    p2p: pl.DataFrame,
    calls: pl.DataFrame,
    ranks: list[RankSummary],
    annotated: dict[int, VirtualStages],
) -> tuple[Pipeline | None, list[str]]:
    """A pipeline with several stages per rank, placed by its annotations (module docstring):
    pipeline position k holds the ranks whose lowest stage is k."""
    by_rank = {r.rank: r for r in ranks}
    virtual = max(len(v.stages) for v in annotated.values())
    held = {rank: v for rank, v in annotated.items() if len(v.stages) == virtual}
    positions = {rank: v.stages[0] for rank, v in held.items()}
    depth = max(max(v.stages) for v in held.values()) + 1
    p = depth // virtual if depth % virtual == 0 else len(set(positions.values()))
    warnings = []
    if len(held) < len(annotated):
        warnings.append(
            f"pipeline: {len(annotated) - len(held)} rank(s) hold fewer than the {virtual} "
            "stages per rank the others hold: left out of the pipeline's stages"
        )
    missing = sorted(set(range(p)) - set(positions.values()))
    if missing:
        listed = ", ".join(f"position {k}" for k in missing[:10])
        warnings.append(
            f"pipeline: {len(missing)} of {p} pipeline position(s) have no trace ({listed}); "
            "the other positions are analysed without them"
        )
    steps = max(p2p["step_key"].n_unique(), 1)
    moved, collective = _moved_and_collective(p2p, calls, steps)
    positions_of = []  # each pipeline position (a rank's place in the ring), as a stage would be
    for k in sorted(set(positions.values())):
        members = sorted(r for r, at in positions.items() if at == k and r in by_rank)
        if members:
            positions_of.append(_stage(k, members, by_rank, moved, collective))
    if len(positions_of) < 2:
        return None, warnings
    m = max(v.microbatches for v in held.values())
    split = any(v.split for v in held.values())
    schedule: Schedule = "zero-bubble" if split else "interleaved"
    ideal = None if split else round((p - 1) / (virtual * m + p - 1), 6)
    stages, work = _virtual_stages(held, positions_of, by_rank)
    pipeline = _pipeline(positions_of, by_rank, m, schedule, ideal, depth, virtual)
    slowest = max(stages, key=lambda s: s.compute_ms)
    phase, ratio = _slowest_of(slowest.stage, work)
    pipeline.stages, pipeline.slowest_stage = stages, slowest.stage
    pipeline.slowest_phase, pipeline.slowest_phase_ratio = phase, ratio
    return pipeline, warnings


def _virtual_stages(
    held: dict[int, VirtualStages],
    positions: list[PipelineStage],
    by_rank: dict[int, RankSummary],
) -> tuple[list[PipelineStage], dict[int, dict[str, float]]]:
    """Each virtual stage as a stage of its own, numbered as the schedule numbers them: its
    compute is its own actions' time (forward; backward, its I and W included) and its share
    of its rank's update (the update is per rank); its bubble and transfer are its rank's (the
    stages a rank holds wait together). Also each stage's forward and backward, per step."""
    position_of = {r: s for s in positions for r in s.ranks}
    members: dict[int, list[int]] = {}
    for rank, v in held.items():
        if rank in position_of:
            for k in v.stages:
                members.setdefault(k, []).append(rank)
    stages, work = [], {}
    for k in sorted(members):
        ranks = sorted(members[k])
        forward = sum(held[r].work_ms.get(k, (0.0, 0.0))[0] for r in ranks) / len(ranks)
        backward = sum(held[r].work_ms.get(k, (0.0, 0.0))[1] for r in ranks) / len(ranks)
        update = sum(by_rank[r].breakdown_ms["update"] / len(held[r].stages) for r in ranks)
        rank_of = position_of[ranks[0]]
        stages.append(
            PipelineStage(
                stage=k,
                ranks=ranks,
                compute_ms=round(forward + backward + update / len(ranks), 3),
                bubble_ms=rank_of.bubble_ms,
                transfer_ms=rank_of.transfer_ms,
            )
        )
        work[k] = {"forward": forward, "backward": backward}
    return stages, work


def _slowest_of(
    slowest: int, work: dict[int, dict[str, float]]
) -> tuple[StragglerPhase | None, float | None]:
    """The phase in which virtual stage ``slowest`` spends the most over the other stages'
    median, and that phase's ratio to the median."""
    others = [w for k, w in work.items() if k != slowest]
    if not others:
        return None, None
    best: tuple[StragglerPhase | None, float, float | None] = (None, 0.0, None)
    for phase in _PHASES:
        mine = work[slowest][phase]
        median = statistics.median(w[phase] for w in others)
        if mine - median > best[1]:
            best = (phase, mine - median, round(mine / median, 2) if median > 0 else None)
    return best[0], best[2]


def _stage(
    k: int, members: list[int], by_rank: dict[int, RankSummary], moved: dict[int, float],
    collective: dict[int, float],
) -> PipelineStage:  # fmt: skip
    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 3)

    compute, bubble, transfer = [], [], []
    for rank in members:
        r = by_rank[rank]
        b = r.breakdown_ms
        work = b["forward"] + b["backward"] + b["update"]
        others = min(collective.get(rank, 0.0), r.comm_exposed_ms)  # the stage's collectives
        blocked = max(r.step_ms - work - b["io"] - b["h2d"] - b["other"] - others, 0.0)
        compute.append(work)
        bubble.append(blocked)
        # (moving while the stage was blocked: no more than its exposed transfer, as a
        # message waited for late had arrived while the stage was computing)
        exposed = r.comm_transfer_ms if r.comm_transfer_ms is not None else blocked
        transfer.append(min(moved.get(rank, 0.0), exposed, blocked))
    return PipelineStage(
        stage=k,
        ranks=members,
        compute_ms=mean(compute),
        bubble_ms=mean(bubble),
        transfer_ms=mean(transfer),
    )


def _slowest_phase(
    slowest: PipelineStage, stages: list[PipelineStage], by_rank: dict[int, RankSummary]
) -> tuple[StragglerPhase | None, float | None]:
    others = [s for s in stages if s is not slowest]
    if not others:
        return None, None

    def phase_ms(stage: PipelineStage, phase: str) -> float:
        return sum(by_rank[r].breakdown_ms[phase] for r in stage.ranks) / len(stage.ranks)

    best: tuple[StragglerPhase | None, float, float | None] = (None, 0.0, None)
    for phase in _PHASES:
        mine = phase_ms(slowest, phase)
        rest = sorted(phase_ms(s, phase) for s in others)
        median = (
            rest[len(rest) // 2]
            if len(rest) % 2
            else (rest[len(rest) // 2 - 1] + rest[len(rest) // 2]) / 2
        )
        if mine - median > best[1]:
            best = (phase, mine - median, round(mine / median, 2) if median > 0 else None)
    return best[0], best[2]


Schedule = Literal["GPipe", "1F1B", "interleaved", "zero-bubble"]


def _schedule(p2p: pl.DataFrame, chains: list[list[int]]) -> Schedule:
    """GPipe when, on every rank, no message of a backward (to the previous stage, or from the
    next) is issued in a step before the last of its forward messages, else 1F1B."""
    stage_of = {r: k for c in chains for k, r in enumerate(c)}
    df = p2p.with_columns(
        pl.col(S.RANK).replace_strict(stage_of, default=None).alias("_me"),
        pl.col("peer_rank").replace_strict(stage_of, default=None).alias("_peer"),
    )
    forward = ((pl.col(S.COLLECTIVE) == "send") & (pl.col("_peer") > pl.col("_me"))) | (
        (pl.col(S.COLLECTIVE) == "recv") & (pl.col("_peer") < pl.col("_me"))
    )
    per_step = (
        df.with_columns(forward.alias("_forward"))
        .group_by(S.RANK, "step_key")
        .agg(
            pl.col("issued").filter(pl.col("_forward")).max().alias("_last_forward"),
            pl.col("issued").filter(~pl.col("_forward")).min().alias("_first_backward"),
        )
    )
    interleaved = per_step.filter(pl.col("_first_backward") < pl.col("_last_forward")).height
    return "1F1B" if interleaved else "GPipe"
