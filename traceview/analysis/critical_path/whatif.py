"""The what-ifs: the changes worth replaying on a graph, the changes named as the report and
``whatif`` name them (``parse_change``), and each replayed over a run's steps in batches."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import polars as pl

from traceview.analysis.critical_path.blame import _OWN
from traceview.analysis.critical_path.graph import _COMPUTING, LATE_START, TRANSFER, Graph
from traceview.analysis.critical_path.replay import Change, Replay, replay
from traceview.analysis.critical_path.source import _batches, _series, _Source
from traceview.analysis.crossrank import BUS_FACTOR
from traceview.model import schema as S
from traceview.model.results import Blame, WhatIf


def what_ifs(graph: Graph, ranks_phase_ms: pl.DataFrame | None = None) -> list[Change]:
    """The changes worth replaying on this graph: none (the check), each rank balanced where
    ranks differ, every rank balanced, hidden communication, no late starts, the largest phase
    and the largest operator 2x faster."""
    changes = [Change("none")]
    items = graph.items
    if items.height == 0:
        return changes
    if items[S.RANK].n_unique() > 1:  # (one rank is its own median: nothing to balance)
        changes += _balanced(graph)
    if graph.calls.height:
        changes.append(Change("hide_comm", hide_comm=True))
    changes.append(Change("no_late_start", no_late_start=True))
    return changes


def _balanced(graph: Graph) -> list[Change]:
    """Every rank's compute phases at the median rank's (per step and phase), where that
    changes any (else nothing)."""
    items = graph.items
    dur = (items[S.END_NS] - items[S.START_NS]).cast(pl.Float64)
    computing = items[S.KIND].is_in(_COMPUTING)
    frame = items.select(S.RANK, S.STEP, S.PHASE).with_columns(dur.alias("d"), computing.alias("c"))
    per = frame.filter(pl.col("c")).group_by(S.STEP, S.RANK, S.PHASE).agg(pl.col("d").sum())
    med = per.group_by(S.STEP, S.PHASE).agg(pl.col("d").median().alias("m"))
    factor = (
        per.join(med, on=[S.STEP, S.PHASE])
        .with_columns((pl.col("m") / pl.col("d")).clip(upper_bound=1.0).alias("f"))
        .select(S.STEP, S.RANK, S.PHASE, "f")
    )
    f = _item_factors(graph, factor, [S.STEP, S.RANK, S.PHASE], computing.to_numpy())
    return [Change("balance", item_factor=f)] if (f < 1.0).any() else []


def faster(graph: Graph, name: str, k: float) -> Change | None:
    """A phase, an operator or a collective ``k`` times faster (None: the graph has no such)."""
    items, calls = graph.items, graph.calls
    label = f"faster:{name}:{k:g}"
    if name in S.BREAKDOWN_PHASES and name != S.COMM:
        hit = (items[S.PHASE] == name).to_numpy() & (items["call"] < 0).to_numpy()
    else:
        hit = ((items[S.OP] == name).fill_null(False) & (items["call"] < 0)).to_numpy()
    hit_calls = (
        (calls[S.COLLECTIVE] == name).to_numpy() | (name == S.COMM)
        if calls.height
        else np.zeros(0, bool)
    )
    if not hit.any() and not hit_calls.any():
        return None
    factor = np.where(hit, 1.0 / k, 1.0)
    transfer = calls["transfer"].to_numpy().astype(np.float64) if calls.height else None
    if transfer is not None:
        transfer = np.where(hit_calls, transfer / k, transfer)
    return Change(label, item_factor=factor, transfer=transfer)


#: The kinds of path time ``without`` can take away (beside phases, operators and collectives).
WITHOUT_KINDS = (S.SEGMENT_HOST_BOUND, S.SEGMENT_LAUNCH, S.SEGMENT_IDLE)


def without(graph: Graph, name: str, rank: int | None = None) -> Change | None:
    """A phase, an operator or a collective (its transfer), or a kind of path time (host-bound,
    launch, idle: ``WITHOUT_KINDS``; ``rank``: only that rank's) taking no time at all (None:
    the graph has no such)."""
    label = f"without:{name}" + (f":rank={rank}" if rank is not None else "")
    if name in WITHOUT_KINDS:
        items = graph.items
        hit = (items[S.KIND] == name).to_numpy() & (items["call"] < 0).to_numpy()
        if rank is not None:
            hit &= (items[S.RANK] == rank).to_numpy()
        return Change(label, item_factor=np.where(hit, 0.0, 1.0)) if hit.any() else None
    if rank is not None:
        raise ValueError(label)  # (a phase or an operator on one rank: balance:rank=N)
    change = faster(graph, name, math.inf)
    return Change(label, change.item_factor, change.transfer) if change is not None else None


def balance_rank(graph: Graph, rank: int) -> Change | None:
    """One rank's compute phases at the median of the other ranks' (per step and phase)."""
    items = graph.items
    dur = (items[S.END_NS] - items[S.START_NS]).cast(pl.Float64)
    computing = items[S.KIND].is_in(_COMPUTING)
    frame = items.select(S.RANK, S.STEP, S.PHASE).with_columns(dur.alias("d"), computing.alias("c"))
    per = frame.filter(pl.col("c")).group_by(S.STEP, S.RANK, S.PHASE).agg(pl.col("d").sum())
    others = (
        per.filter(pl.col(S.RANK) != rank)
        .group_by(S.STEP, S.PHASE)
        .agg(pl.col("d").median().alias("m"))
    )
    mine = per.filter(pl.col(S.RANK) == rank).join(others, on=[S.STEP, S.PHASE])
    if mine.height == 0:
        return None
    factor = mine.with_columns((pl.col("m") / pl.col("d")).clip(upper_bound=1.0).alias("f")).select(
        S.STEP, pl.col(S.RANK), S.PHASE, "f"
    )
    f = _item_factors(graph, factor, [S.STEP, S.RANK, S.PHASE], computing.to_numpy())
    return Change(f"balance:rank={rank}", item_factor=f)


def _item_factors(graph: Graph, factor: pl.DataFrame, on: list[str], hit: np.ndarray) -> np.ndarray:
    """Per item of ``graph``, its ``factor`` row's ``f`` (joined on ``on``) where ``hit``, else 1."""
    joined = graph.items.select(on).with_row_index("_i").join(factor, on=on, how="left").sort("_i")
    return np.where(hit, joined["f"].fill_null(1.0).to_numpy(), 1.0)


def item_stages(graph: Graph) -> np.ndarray | None:
    """Per item of ``graph``, the pipeline stage whose action holds its start (-1: none; None:
    the graph has no actions). An action's region also holds the schedule's waits for its
    input: only the rank's own work in it is the stage's."""
    actions = graph.actions
    if actions is None or actions.height == 0:
        return None
    items = graph.items.select(S.RANK, S.START_NS).with_row_index("_i")
    held = (
        items.sort(S.RANK, S.START_NS)
        .join_asof(
            actions.select(
                S.RANK, pl.col(S.START_NS).alias("_at"), pl.col(S.END_NS).alias("_until"), S.STAGE
            ),
            left_on=S.START_NS,
            right_on="_at",
            by=S.RANK,
            check_sortedness=False,
        )
        .with_columns(
            pl.when(pl.col(S.START_NS) < pl.col("_until")).then(pl.col(S.STAGE)).otherwise(-1)
        )
        .sort("_i")
    )
    return held[S.STAGE].fill_null(-1).to_numpy()


def work_by_stage(graph: Graph, stages: np.ndarray | None = None) -> pl.DataFrame | None:
    """Per step, rank, stage and phase, the stage's own work in the graph (ns, ``d``); None
    without a pipeline's actions. ``stages``: ``item_stages`` of the graph, where made."""
    stages = item_stages(graph) if stages is None else stages
    if stages is None:
        return None
    items = graph.items
    return (
        items.select(S.RANK, S.STEP, S.PHASE)
        .with_columns(
            pl.Series(S.STAGE, stages, pl.Int32),
            (items[S.END_NS] - items[S.START_NS]).cast(pl.Float64).alias("d"),
            items[S.KIND].is_in(_COMPUTING).alias("c"),
        )
        .filter(pl.col("c") & (pl.col(S.STAGE) >= 0))
        .group_by(S.STEP, S.RANK, S.STAGE, S.PHASE)
        .agg(pl.col("d").sum())
    )


def balance_stage(graph: Graph, stage: int) -> Change | None:
    """One pipeline stage's work at the median of the other stages' (per step and phase): the
    rank's other stages as they were (a rank holds several stages in an interleaved
    schedule)."""
    stages = item_stages(graph)
    per = work_by_stage(graph, stages)
    if stages is None or per is None:
        return None
    others = (
        per.filter(pl.col(S.STAGE) != stage)
        .group_by(S.STEP, S.PHASE)
        .agg(pl.col("d").median().alias("m"))
    )
    mine = per.filter(pl.col(S.STAGE) == stage).join(others, on=[S.STEP, S.PHASE])
    if mine.height == 0:
        return None
    factor = mine.select(
        S.STEP, S.PHASE, (pl.col("m") / pl.col("d")).clip(upper_bound=1.0).alias("f")
    )
    hit = graph.items[S.KIND].is_in(_COMPUTING).to_numpy() & (stages == stage)
    f = _item_factors(graph, factor, [S.STEP, S.PHASE], hit)
    return Change(f"balance:stage={stage}", item_factor=f)


def at_bandwidth(graph: Graph, op: str, gbps: float) -> Change | None:
    """Calls of collective ``op`` at a bus bandwidth of ``gbps`` Gb/s (bits, as the report's
    busbw_gbps): transfer = bus bytes / bandwidth."""
    calls = graph.calls
    if calls.height == 0:
        return None
    hit = (calls[S.COLLECTIVE] == op).to_numpy() & calls[S.BYTES].is_not_null().to_numpy()
    if not hit.any():
        return None
    n = calls["participants"].fill_null(2).to_numpy().astype(np.float64)
    factor = np.array([BUS_FACTOR[op](v) for v in n]) if op in BUS_FACTOR else np.ones(len(n))
    bus = calls[S.BYTES].fill_null(0).to_numpy().astype(np.float64) * factor
    transfer = calls["transfer"].to_numpy().astype(np.float64)
    transfer = np.where(hit, bus * 8 / gbps, transfer)  # bits over Gb/s: ns
    return Change(f"bandwidth:{op}:{gbps:g}", transfer=transfer)


def parse_change(graph: Graph, text: str) -> Change | None:
    """A change as the report and ``whatif`` name it (WhatIf.change); None where the graph has
    nothing it applies to. Raises ValueError for a change that is not well formed."""
    name, _, rest = text.partition(":")
    if name == "none":
        return Change("none")
    if name == "balance" and not rest:
        return next((c for c in what_ifs(graph) if c.name == "balance"), None)
    if name == "balance" and rest.startswith("rank="):
        return balance_rank(graph, int(rest.removeprefix("rank=")))
    if name == "balance" and rest.startswith("stage="):
        return balance_stage(graph, int(rest.removeprefix("stage=")))
    if name == "faster":
        what, _, k = rest.rpartition(":")
        if not what or float(k) <= 0:
            raise ValueError(text)
        return faster(graph, what, float(k))
    if name == "bandwidth":
        op, _, gbps = rest.rpartition(":")
        if not op or float(gbps) <= 0:
            raise ValueError(text)
        return at_bandwidth(graph, op, float(gbps))
    if name == "without" and rest:
        what, _, which = rest.partition(":rank=")
        return without(graph, what, int(which) if which else None)
    if name == "hide_comm" and not rest:
        return Change("hide_comm", hide_comm=True)
    if name == "no_late_start" and not rest:
        return Change("no_late_start", no_late_start=True)
    if name == "no_late_start" and rest.startswith("rank="):
        late = int(rest.removeprefix("rank="))
        return Change(text, no_late_start=True, late_ranks=frozenset([late]))
    raise ValueError(text)


def _changes(
    graph: Graph, ranks: int, blame: list[Blame], by_op: pl.DataFrame, extra: list[str]
) -> Iterator[Change | None]:
    """The changes the report replays, in its order (None: nothing in ``graph`` it applies
    to): none, balance, hide_comm, no_late_start, the rank with the most of its own time
    balanced, the top phase, the top operator and the top collective 2x faster, then
    ``extra``. Each slot names the same change in every batch of a run's steps. Made one at
    a time, as replayed: a change holds an array an item."""
    by_name = {c.name: c for c in what_ifs(graph)}
    for name in ("none", "balance", "hide_comm", "no_late_start"):
        yield by_name.pop(name, None)
    del by_name
    top_rank = next((b.rank for b in blame if b.kind in _OWN and b.kind != LATE_START), None)
    yield balance_rank(graph, top_rank) if ranks > 1 and top_rank is not None else None
    top_phase = next(
        (b.phase for b in blame if b.kind in _OWN and b.phase not in (None, S.IDLE)), None
    )
    yield faster(graph, top_phase, 2.0) if top_phase is not None else None
    top_op = next((r["op"] for r in by_op.iter_rows(named=True) if r["kind"] in _OWN), None)
    wanted_op = top_op is not None and top_op != top_phase
    yield faster(graph, top_op, 2.0) if wanted_op else None  # type: ignore[arg-type]
    comm_op = next((r["op"] for r in by_op.iter_rows(named=True) if r["kind"] == TRANSFER), None)
    yield faster(graph, comm_op, 2.0) if comm_op is not None else None
    for text in extra:
        yield parse_change(graph, text)


def _what_ifs(
    source: _Source, steps: list[int], blame: list[Blame], by_op: pl.DataFrame, extra: list[str]
) -> list[WhatIf]:
    """Each change replayed over ``steps`` (the counted ones), a batch at a time: a change
    with nothing to apply to in a batch leaves its steps as replayed with none. A change is
    reported where it applies to some batch, in its first slot's place (``_changes``)."""
    windows = source.windows().filter(pl.col(S.STEP).is_in(_series(steps)))
    ranks = windows[S.RANK].n_unique()
    slot_of: dict[str, int] = {}
    per_batch: list[dict[str, Replay]] = []  # per batch, per change (its "none" always)
    for batch in _batches(source, steps):
        graph = source.graph(batch)
        if graph is None:
            continue
        results: dict[str, Replay] = {}
        for slot, change in enumerate(_changes(graph, ranks, blame, by_op, extra)):
            if change is None or change.name in results:
                continue
            slot_of[change.name] = min(slot_of.get(change.name, slot), slot)
            results[change.name] = replay(graph, change)
            del change  # (before the next is made)
        per_batch.append(results)
        del graph
    out: list[WhatIf] = []
    base: float | None = None
    for name in sorted(slot_of, key=slot_of.__getitem__):
        # each step's replay (the batches hold distinct steps): the change's, where it applied
        # to the step's batch, else none's
        step_ns = np.concatenate([r.get(name, r["none"]).ns for r in per_batch])
        ms = float(np.mean(np.sort(step_ns))) / 1e6 if len(step_ns) else 0.0
        if base is None:
            base = ms
        ends = [r[name].last for r in per_batch if name in r]
        out.append(
            WhatIf(
                change=name,
                step_ms=round(ms, 3),
                speedup=round(base / ms, 3) if ms > 0 else 0.0,
                last_rank=_most_often(np.concatenate(ends)) if ends else None,
            )
        )
    return out


def _most_often(ranks: np.ndarray) -> int | None:
    """The rank that comes most often (a tie: the lowest)."""
    if not len(ranks):
        return None
    values, counts = np.unique(ranks, return_counts=True)
    return int(values[np.argmax(counts)])  # (values sorted: the first of the most)
