"""The graph of a run's counted steps (``Graph``: items and calls), the kinds and constants every
part of the critical path reads, and what every replay of a graph starts from (``_Timed``).

The graph. Each rank's step window is the sequence of its exclusive segments (the segments
table: the attribution rule kept in time order). A segment of exposed communication is cut at
the ends of the rank's matched calls inside it: each piece before a call's end **waits for that
call**. The edges:

- in order on a rank: a segment starts when the one before it ends; the first at the rank's
  step start (a rank that starts later than the first rank of the step is a **late start**,
  carried in from before the window);
- a call completes ``transfer`` after the later of its group's **last arrival** (when the last
  member's program issued it; for point-to-point, the later of the send's issue and the moment
  the receiver began waiting for it, and a send is done when its receive is) and the completion
  of the call before it on the same queue (gloo's worker thread, the NCCL stream): calls on a
  queue run one after the other (where one ended before the one begun before it, a new queue);
- a waiting piece ends when its call completes (or at once, where it completed already);
- an arrival is where the issuing rank's timeline stood: its own segment's start plus how far
  into it the call was issued.

The critical path walks these edges back from the step's end (the last rank to finish):
through a rank's own segments, and at a waiting piece to what the call waited for: its
transfer, the call queued before it, or the last member at the moment it arrived. Every instant
of the job's step (first rank's start to last rank's end) is on the path once, so the path's
segments add up to the step. Blame is the path's time per rank, phase and kind (and operator).

Replay re-times the same graph from the edges alone (never from the recorded starts): every
start comes from its predecessors, so replaying with no change reproduces the measured steps
(a test says so), and with a change (a rank balanced, a phase or an operator faster, a
collective faster, communication hidden, late starts removed) predicts the step.

Vectorized: a replay pass is a few grouped cumulative maxima over every segment of every step
at once (polars), repeated until the calls' completions stop moving (as many passes as the
longest chain of calls that wait on each other); the walk loops over the path's waits only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceview.model import schema as S

NEVER = -(1 << 62)
NO_STEP = -1  # the step number of a window without step markers
TRANSFER = "transfer"
LATE_START = "late_start"
#: The kinds of a path segment: the segments table's, with waits explained.
PATH_KINDS = (
    S.SEGMENT_COMPUTE,
    S.SEGMENT_KERNEL,
    S.SEGMENT_LAUNCH,
    TRANSFER,
    LATE_START,
    S.SEGMENT_HOST_BOUND,
    S.SEGMENT_IDLE,
)
#: The kinds of a rank's own work (what balance and blame count as the rank's).
_COMPUTING = [S.SEGMENT_COMPUTE, S.SEGMENT_KERNEL, S.SEGMENT_LAUNCH, S.SEGMENT_HOST_BOUND]


@dataclass
class Graph:
    """The counted steps of a run as one graph: items (segments and waiting pieces) and calls."""

    items: pl.DataFrame  # sorted by (rank, step, start): rank, step, start, end, phase, kind,
    #                      op, call (row of calls it waits for, -1), group (per rank and step)
    calls: pl.DataFrame  # row order = call ids: rank, collective, op name, issued, end, instance,
    #                      queue, prev (call before it on its queue, -1), transfer, uses_all,
    #                      issue_item (-1: issued outside the counted windows), issue_offset
    steps: list[int]
    unmatched_steps: dict[int, str]  # steps whose communication is not all explained: why
    # a pipeline's actions in these steps (rank, step, stage, start, end; on the items' clock):
    # which stage an item's work is (None: no pipeline named its actions)
    actions: pl.DataFrame | None = None
    _timed: _Timed | None = field(default=None, repr=False, compare=False)

    def timed(self) -> _Timed:
        """What every replay of the graph starts from (made once: a replay a change)."""
        if self._timed is None:
            self._timed = _Timed.of(self)
        return self._timed


@dataclass
class _Timed:
    """A graph's items as a replay takes them, whatever the change: times from the graph's
    first instant (float64 holds them to the nanosecond), their groups (a rank's step) and
    each group's head, and only the calls that can move them (``_calls_that_move``)."""

    t0: int
    span: np.ndarray  # each item's end - start, float64
    group: np.ndarray
    call: np.ndarray  # the call each item waits for (-1: none), in ``calls``' numbering
    calls: pl.DataFrame
    kept: np.ndarray | None  # which of the graph's calls ``calls`` are (None: all)
    first: np.ndarray  # the first item of each group
    heads: np.ndarray
    g_start: np.ndarray  # each group's measured start
    g_step: np.ndarray
    step_first: np.ndarray  # per group, its step's earliest start over the ranks
    g_rank: np.ndarray  # per group, its rank

    @classmethod
    def of(cls, graph: Graph) -> _Timed:
        items = graph.items
        n = items.height
        t0 = int(items[S.START_NS].min()) if n else 0  # type: ignore[arg-type]
        start = items[S.START_NS].to_numpy()
        group = items["group"].to_numpy()
        # only the calls of the graph's steps and those its items wait for move its items (a
        # batch holds every step its waits reach: ``_tied``); the others are left out
        calls, call, kept = _calls_that_move(graph, items["call"].to_numpy())
        first = np.ones(n, bool)
        first[1:] = group[1:] != group[:-1]
        heads = np.flatnonzero(first)
        g_start = (start[first] - t0).astype(np.float64)
        g_step = items[S.STEP].to_numpy()[first]
        step_first = g_start
        if len(heads):
            job_start = (
                pl.DataFrame({"s": g_step, "t": g_start}).group_by("s").agg(pl.col("t").min())
            )
            job_of = dict(zip(job_start["s"].to_list(), job_start["t"].to_list(), strict=True))
            step_first = np.array([job_of[s] for s in g_step])
        span = _durations(start, items[S.END_NS].to_numpy())
        g_rank = items[S.RANK].to_numpy()[first]
        return cls(
            t0, span, group, call, calls, kept, first, heads, g_start, g_step, step_first, g_rank
        )  # fmt: skip


def _durations(start: np.ndarray, end: np.ndarray, block: int = 1 << 20) -> np.ndarray:
    """``end - start`` (int64 ns, exact) as float64, a block at a time: no int64 copy of every
    item beside the result (one long step is millions of items)."""
    out = np.empty(len(start), np.float64)
    for lo in range(0, len(start), block):
        out[lo : lo + block] = end[lo : lo + block] - start[lo : lo + block]
    return out


def _calls_that_move(
    graph: Graph, call: np.ndarray
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray | None]:
    """The calls of ``graph``'s steps and of the steps of the calls its items wait for
    (``call``: each item's, -1 for none: an instance's members and a queue's calls in one step
    share their step), renumbered, with the items' call ids to match and which calls they are
    (None: all)."""
    calls = graph.calls
    if calls.height == 0:
        return calls, call, None
    label = calls[S.STEP].fill_null(NO_STEP).to_numpy()
    keep = np.isin(label, np.union1d(graph.steps, label[call[call >= 0]]))
    if keep.all():
        return calls, call, None
    kept = np.flatnonzero(keep)
    renumber = np.full(calls.height, -1, np.int64)
    renumber[kept] = np.arange(len(kept))
    call = np.where(call >= 0, renumber[np.maximum(call, 0)], -1)
    return calls[kept], call, kept
