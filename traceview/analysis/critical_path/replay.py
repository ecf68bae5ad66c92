"""Replay: a graph re-timed from its edges alone, with or without a change (``Change``,
``replay``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceview.analysis.critical_path.graph import NEVER, Graph
from traceview.analysis.crossrank import ISSUED
from traceview.model import schema as S


@dataclass
class Change:
    """A what-if: per-item duration factors, per-call transfer, and how steps start."""

    name: str
    item_factor: np.ndarray | None = None  # multiplies each item's duration
    transfer: np.ndarray | None = None  # each call's transfer (ns)
    hide_comm: bool = False  # every wait is over at once (the collective edges dropped)
    # every rank starts the step with the first (and idles no more after its last wait)
    no_late_start: bool = False
    late_ranks: frozenset[int] | None = None  # ... only these ranks do (None: every rank)
    no_queue: bool = False  # calls on one queue do not wait for each other (tests drop it)


@dataclass
class Replay:
    """The replayed steps, as arrays (a run of 100,000 tiny steps): each step's number, the
    job's step (ns) and the rank that ends it."""

    steps: np.ndarray  # int64
    ns: np.ndarray  # int64
    passes: int
    converged: bool
    last: np.ndarray  # int64

    @property
    def step_ns(self) -> dict[int, int]:
        return dict(zip(self.steps.tolist(), self.ns.tolist(), strict=True))

    @property
    def last_rank(self) -> dict[int, int]:
        return dict(zip(self.steps.tolist(), self.last.tolist(), strict=True))


def _idle_tails(
    items: pl.DataFrame, group: np.ndarray, wait: np.ndarray, on_time: np.ndarray
) -> np.ndarray:
    """Which items are idling that ends a step of a rank started on time (``on_time``, per
    group), after its last wait in that step: nothing in the step waits for it, it only makes
    the rank start its next step late (a sleep after the last collective), so it goes with the
    late start it causes."""
    n = len(group)
    if n == 0:
        return np.zeros(0, bool)
    groups = int(group.max()) + 1
    last = np.full(groups, -1)
    waits = np.flatnonzero(wait)
    np.maximum.at(last, group[waits], waits)
    # the items after each such group's last wait, marked as runs (an array of bytes, not an
    # index an item: a step of millions of items)
    ends = np.searchsorted(group, np.arange(1, groups + 1))
    marked = (last >= 0) & on_time
    edges = np.zeros(n + 1, np.int8)
    np.add.at(edges, last[marked] + 1, 1)
    np.add.at(edges, ends[marked], -1)
    after = np.cumsum(edges[:-1], dtype=np.int8).view(bool)
    return (items[S.KIND] == S.SEGMENT_IDLE).to_numpy() & after


def replay(graph: Graph, change: Change | None = None) -> Replay:
    """Re-time the graph from its edges alone (the docstring of ``graph``).

    A rank's item ends at E_i = P_i + max(origin, max over its waits j <= i of (C_j - P_j)),
    P the sum of its durations so far (a wait lasts nothing of its own; C_j the completion of
    the call it waits for): only the waits and the calls move from pass to pass, so a pass
    costs their number, not the items'."""
    change = change or Change("none")
    items = graph.items
    n = items.height
    every_call = graph.calls.height
    timed = graph.timed()
    t0, group, call, calls = timed.t0, timed.group, timed.call, timed.calls
    first, heads, g_step = timed.first, timed.heads, timed.g_step
    transfer_of = change.transfer
    if transfer_of is not None and timed.kept is not None:
        transfer_of = transfer_of[timed.kept]
    wait = call >= 0
    # (one array an item, made once and worked in place: a step can be millions of items)
    dur = timed.span * change.item_factor if change.item_factor is not None else timed.span.copy()
    dur[wait] = 0.0
    origin = timed.g_start
    if change.no_late_start:
        on_time = (
            np.isin(timed.g_rank, list(change.late_ranks))
            if change.late_ranks is not None
            else np.ones(len(origin), bool)
        )
        origin = np.where(on_time, timed.step_first, timed.g_start)
        dur[_idle_tails(items, group, wait, on_time)] = 0.0
    # prefix sums of durations per group (each group from 0)
    prefix = np.cumsum(dur, out=dur)
    before = np.where(heads > 0, prefix[np.maximum(heads - 1, 0)], 0.0)
    _minus_per_group(prefix, heads, before)  # P_i, i included
    waits = np.flatnonzero(wait)
    w_group = group[waits]
    w_prefix = prefix[waits]

    def last_wait(at: np.ndarray) -> np.ndarray:
        """Per item index, the position in ``waits`` of its group's last wait at or before it
        (-1: none)."""
        if len(waits) == 0:
            return np.full(len(at), -1)
        pos = np.searchsorted(waits, at, side="right") - 1
        ok = (pos >= 0) & (w_group[np.maximum(pos, 0)] == group[np.maximum(at, 0)])
        return np.where(ok & (at >= 0), pos, -1)

    def ends_at(at: np.ndarray, held: np.ndarray, reach: np.ndarray) -> np.ndarray:
        """E' of items ``at`` given each one's last wait (``held``) and the waits' running
        maxima (``reach``)."""
        if len(reach) == 0:
            return prefix[at] + origin[group[at]]
        term = np.where(held >= 0, reach[np.maximum(held, 0)], float(NEVER))
        return prefix[at] + np.maximum(origin[group[at]], term)

    m = calls.height
    ready = np.full(m, float(NEVER))  # each call's completion, replayed
    reach = np.full(len(waits), float(NEVER))
    passes, converged = 0, True
    if m:
        c_issued = (calls[ISSUED].to_numpy() - t0).astype(np.float64)
        c_item = calls["issue_item"].to_numpy()
        c_off = calls["issue_offset"].to_numpy().astype(np.float64)
        inst = calls["instance"].to_numpy() - 1
        # the queue's calls of one step replay in order; the first waits for the call before
        # it as measured (a step's replay never moves the next one's calls)
        queue = calls["queue"].to_numpy() * (1 << 24) + calls[S.STEP].fill_null(-1).to_numpy()
        uses_all = calls["uses_all"].to_numpy()
        prev_end = calls["prev_end"].to_numpy()
        prev_end = np.where(prev_end > NEVER, prev_end - t0, NEVER).astype(np.float64)
        transfer = (
            transfer_of if transfer_of is not None else calls["transfer"].to_numpy()
        ).astype(np.float64)
        q_first = np.ones(m, bool)
        q_first[1:] = queue[1:] != queue[:-1]
        q_csum = np.cumsum(transfer)
        q_heads = np.flatnonzero(q_first)
        q_before = np.concatenate([[0.0], q_csum])[q_heads]
        q_prefix = q_csum - np.repeat(q_before, np.diff(np.append(q_heads, m)))
        shifted = np.where(q_first, 0.0, np.concatenate([[0.0], q_prefix[:-1]]))
        issued_on = c_item >= 0
        item = np.maximum(c_item, 0)
        span = timed.span[item]
        is_wait = wait[item]
        held_end = last_wait(item)
        held_start = np.where(first[item], -2, last_wait(item - 1))
        w_call = call[waits]
        # a wait released before its call's span closed keeps that lead, scaled with the
        # call's transfer (_released_early)
        t_measured = calls["transfer"].to_numpy().astype(np.float64)[w_call]
        w_early = items["early"].to_numpy()[waits].astype(np.float64)
        w_early *= np.where(t_measured > 0, transfer[w_call] / np.maximum(t_measured, 1), 1.0)
    while True:
        passes += 1
        r = np.full(len(waits), float(NEVER))
        if m and not change.hide_comm:
            r = ready[w_call] - w_early
        reach = _group_cummax(r - w_prefix, w_group)
        if m == 0:
            break
        # where each call is issued now: its item's replayed start plus how far into it
        e_item = ends_at(item, held_end, reach)
        s_item = np.where(
            held_start == -2,
            origin[group[item]],
            ends_at(np.maximum(item - 1, 0), np.maximum(held_start, -1), reach),
        )
        now_span = e_item - s_item
        scaled = np.where(span > 0, c_off * now_span / np.where(span > 0, span, 1), 0.0)
        into = np.where(is_wait, np.minimum(c_off, now_span), scaled)
        issue = np.where(issued_on, s_item + into, c_issued)
        last = np.full(int(inst.max()) + 1, float(NEVER))
        np.maximum.at(last, inst, issue)
        arrival = np.where(uses_all, last[inst], issue)
        arrival = np.where(q_first, np.maximum(arrival, prev_end), arrival)
        if change.no_queue:
            new_ready = arrival + transfer
        else:  # on a queue: C_c = max(A_c, C_prev) + T_c, a cumulative maximum
            new_ready = q_prefix + _group_cummax(arrival - shifted, queue)
        if np.array_equal(new_ready, ready):
            break
        ready = new_ready
        if passes > every_call + 1:  # (a graph without cycles settles in a pass a call)
            converged = False
            break
    tails = np.append(heads[1:] - 1, n - 1) if n else heads
    g_end = ends_at(tails, last_wait(tails), reach) if n else np.zeros(0)
    out = (
        pl.DataFrame({"s": g_step, "b": origin, "e": g_end, "r": timed.g_rank})
        .group_by("s")
        .agg(
            (pl.col("e").max() - pl.col("b").min()).alias("d"),
            pl.col("r").sort_by("e", "r", descending=[True, False]).first().alias("last"),
        )
    )
    # (the job's step to the ns, as ``round`` gives it: half to even)
    return Replay(
        out["s"].cast(pl.Int64).to_numpy(),
        np.rint(out["d"].cast(pl.Float64).to_numpy()).astype(np.int64),
        passes,
        converged,
        out["last"].cast(pl.Int64).to_numpy(),
    )


def _minus_per_group(values: np.ndarray, heads: np.ndarray, amounts: np.ndarray) -> None:
    """Each group's ``amounts`` taken from its ``values`` in place (``heads``: where each group
    begins): slice by slice where the groups are few (one long step: no array an item), else
    at once."""
    if len(heads) <= 256:
        tails = [*heads[1:].tolist(), len(values)]
        for lo, hi, amount in zip(heads.tolist(), tails, amounts.tolist(), strict=True):
            values[lo:hi] -= amount
    else:
        values -= np.repeat(amounts, np.diff(np.append(heads, len(values))))


def _group_cummax(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Cumulative maximum restarting at each group (``group`` sorted; values in ns, NEVER for
    none): one ``np.maximum.accumulate`` over integers lifted by group."""
    if len(values) == 0:
        return values
    none = values <= NEVER / 2
    if none.all():
        return values
    lowest = float(values[~none].min()) - 1.0
    lifted = np.round(np.where(none, lowest, values) - lowest).astype(np.int64)
    span = int(lifted.max()) + 1
    rank = np.concatenate([[0], np.cumsum(group[1:] != group[:-1])])  # dense, from 0
    if int(rank[-1]) * span >= 1 << 62:  # (groups times span beyond int64: polars)
        frame = pl.DataFrame({"v": values, "g": group})
        return frame.select(pl.col("v").cum_max().over("g")).to_series().to_numpy()
    base = rank.astype(np.int64) * span
    out = (np.maximum.accumulate(lifted + base) - base).astype(np.float64) + lowest
    return np.where(out <= lowest, float(NEVER), out)
