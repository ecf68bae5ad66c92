"""The critical path across ranks, blame and what-if replay (issue 33) on small graphs whose
answers are worked out by hand; real jobs with injected causes are in
tests/live/test_critical_path.py, every sample and shared trace in
tests/integration/test_critical_path_traces.py."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from traceview.analysis.critical_path import (
    LATE_START,
    Change,
    PathPiece,
    _stretches,
    balance_rank,
    build_graph,
    critical_paths,
    faster,
    parse_change,
    replay,
)
from traceview.analysis.crossrank import Matched
from traceview.model import schema as S

MS = 1_000_000


def _segments(rows: list[tuple[int, int, int, str, str, str | None]], step: int = 1) -> pa.Table:
    """(rank, start ms, end ms, phase, kind, op) rows as a segments table."""
    return pa.table(
        {
            S.RANK: pa.array([r[0] for r in rows], pa.int32()),
            S.STEP: pa.array([step] * len(rows), pa.int64()),
            S.START_NS: pa.array([r[1] * MS for r in rows], pa.int64()),
            S.END_NS: pa.array([r[2] * MS for r in rows], pa.int64()),
            S.PHASE: [r[3] for r in rows],
            S.KIND: [r[4] for r in rows],
            S.OP: pa.array([r[5] for r in rows], pa.string()),
        },
        schema=S.SEGMENTS_SCHEMA,
    )


def _calls(rows: list[dict]) -> Matched:
    """Matched calls as crossrank.match_collectives gives them (times in ms)."""
    frame = pl.DataFrame(
        [
            {
                S.RANK: r["rank"], S.STEP: 1, S.NAME: r.get("name", "gloo:all_reduce"),
                S.COLLECTIVE: r.get("op", "allreduce"), S.PID: 1, S.TID: r.get("tid", 7),
                S.START_NS: r["start"] * MS, S.END_NS: r["end"] * MS,
                "issued": r["issued"] * MS, "last_arrival_ns": r["last"] * MS,
                "last_rank": r["last_rank"], "group_key": "", "step_key": 1,
                "position": r.get("position", 0), "participants": 2, S.BYTES: r.get("bytes"),
            }
            for r in rows
        ],
        schema_overrides={S.RANK: pl.Int32, "last_rank": pl.Int32, S.BYTES: pl.Int64},
    )  # fmt: skip
    return Matched(frame)


def _two_ranks() -> tuple[pa.Table, Matched]:
    """Rank 0 computes 10 ms, then waits in an all-reduce until 30. Rank 1 starts the step 5 ms
    late, computes 20 ms and issues the all-reduce at 25; the call takes 5 ms after that."""
    segments = _segments(
        [
            (0, 0, 10, S.FORWARD, S.SEGMENT_COMPUTE, "linear"),
            (0, 10, 30, S.COMM, S.SEGMENT_COMM, "allreduce"),
            (1, 5, 25, S.BACKWARD, S.SEGMENT_COMPUTE, "linear_backward"),
            (1, 25, 30, S.COMM, S.SEGMENT_COMM, "allreduce"),
        ]
    )
    calls = _calls(
        [
            {"rank": 0, "start": 10, "end": 30, "issued": 10, "last": 25, "last_rank": 1},
            {"rank": 1, "start": 25, "end": 30, "issued": 25, "last": 25, "last_rank": 1},
        ]
    )
    return segments, calls


def _walk(segments: pa.Table, calls: Matched) -> list[tuple[int, str | None, str, float]]:
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    (path,) = critical_paths(graph)
    return [(x.rank, x.phase, x.kind, x.dur_ns / MS) for x in path.pieces if x.dur_ns]


def test_the_path_runs_through_the_late_rank_and_tiles_the_step() -> None:
    segments, calls = _two_ranks()
    assert _walk(segments, calls) == [
        (1, None, "late_start", 5.0),
        (1, S.BACKWARD, S.SEGMENT_COMPUTE, 20.0),
        (1, S.COMM, "transfer", 5.0),
    ]


def test_replay_reproduces_the_step_and_answers_what_ifs_by_hand() -> None:
    segments, calls = _two_ranks()
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 30 * MS}
    # rank 1 on time: it issues at 20, the call ends 5 ms later, rank 0 waits until 25
    assert replay(graph, Change("no_late_start", no_late_start=True)).step_ns == {1: 25 * MS}
    # no waiting for communication: rank 0 ends at 10, rank 1 at 25
    hidden = replay(graph, Change("hide_comm", hide_comm=True))
    assert hidden.step_ns == {1: 25 * MS} and hidden.last_rank == {1: 1}
    # both ranks end at 30 as measured: the tie goes to the lower rank
    assert replay(graph).last_rank == {1: 0}
    # backward twice as fast: rank 1 issues at 15, done at 20
    change = faster(graph, S.BACKWARD, 2.0)
    assert change is not None and replay(graph, change).step_ns == {1: 20 * MS}
    # the all-reduce twice as fast: done at 27.5
    change = faster(graph, "allreduce", 2.0)
    assert change is not None and replay(graph, change).step_ns == {1: 27.5 * MS}


def test_dropping_the_collective_edges_breaks_the_replay() -> None:
    """The replay takes every start from predecessors and edges: without the collective edges
    (every wait over at once) it cannot reproduce the measured step."""
    segments, calls = _two_ranks()
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    measured = 30 * MS
    assert replay(graph).step_ns[1] == measured
    assert replay(graph, Change("x", hide_comm=True)).step_ns[1] != measured


def test_a_call_queued_behind_another_waits_for_it() -> None:
    """Rank 0 issues two all-reduces at once on one worker; the first waits for rank 1 (issued
    at 20) and takes 5 ms, the second takes 3 ms after it. Dropping the queue's edge makes the
    second end 3 ms after the last arrival: the replay no longer reproduces the step."""
    segments = _segments(
        [
            (0, 0, 2, S.BACKWARD, S.SEGMENT_COMPUTE, "mm"),
            (0, 2, 28, S.COMM, S.SEGMENT_COMM, "allreduce"),
            (1, 0, 20, S.BACKWARD, S.SEGMENT_COMPUTE, "mm"),
            (1, 20, 28, S.COMM, S.SEGMENT_COMM, "allreduce"),
        ]
    )
    calls = _calls(
        [
            {"rank": 0, "start": 2, "end": 25, "issued": 2, "last": 20, "last_rank": 1},
            {"rank": 0, "start": 25, "end": 28, "issued": 2, "last": 20, "last_rank": 1,
             "position": 1},
            {"rank": 1, "start": 20, "end": 25, "issued": 20, "last": 20, "last_rank": 1},
            {"rank": 1, "start": 25, "end": 28, "issued": 20, "last": 20, "last_rank": 1,
             "position": 1},
        ]
    )  # fmt: skip
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 28 * MS}
    assert replay(graph, Change("x", no_queue=True)).step_ns == {1: 25 * MS}
    # the path: rank 1's compute, then the first call's transfer, then the second's
    assert _walk(segments, calls) == [
        (1, S.BACKWARD, S.SEGMENT_COMPUTE, 20.0),
        (1, S.COMM, "transfer", 5.0),
        (1, S.COMM, "transfer", 3.0),
    ]


def test_point_to_point_waits_for_the_send() -> None:
    """Stage 0 computes 12 ms and sends; stage 1 posts its receive at 2 and waits: the path is
    stage 0's compute, then the message's transfer on stage 1."""
    segments = _segments(
        [
            (0, 0, 12, S.FORWARD, S.SEGMENT_COMPUTE, "linear"),
            (0, 12, 13, S.COMM, S.SEGMENT_COMM, "send"),
            (1, 0, 2, S.FORWARD, S.SEGMENT_COMPUTE, "relu"),
            (1, 2, 14, S.COMM, S.SEGMENT_COMM, "recv"),
        ]
    )
    frame = _calls(
        [
            {"rank": 0, "op": "send", "name": "gloo:send", "start": 12, "end": 13, "issued": 12,
             "last": 12, "last_rank": 0},
            {"rank": 1, "op": "recv", "name": "gloo:recv", "start": 2, "end": 14, "issued": 2,
             "last": 12, "last_rank": 0},
        ]
    ).calls.with_columns(pl.Series("peer_rank", [1, 0], pl.Int32))  # fmt: skip
    calls = Matched(frame)
    assert _walk(segments, calls) == [
        (0, S.FORWARD, S.SEGMENT_COMPUTE, 12.0),
        (1, S.COMM, "transfer", 2.0),
    ]
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 14 * MS}
    change = faster(graph, S.FORWARD, 2.0)  # stage 0 sends at 6, stage 1 done at 8
    assert change is not None and replay(graph, change).step_ns == {1: 8 * MS}


def _p2p(rows: list[dict]) -> Matched:
    """Point-to-point calls (``peer``: the other rank) as match_collectives gives them."""
    frame = _calls([{"name": f"gloo:{r['op']}", **r} for r in rows]).calls.with_columns(
        pl.Series("peer_rank", [r["peer"] for r in rows], pl.Int32)
    )
    return Matched(frame)


def test_a_receive_waited_for_late_moves_when_its_rank_waits() -> None:
    """Rank 1 posts a receive at 0, computes its forward until 10, then waits 1 ms for the
    message rank 0 sent at 2 (gloo completes it once the rank waits), and computes its
    backward until 25. The message moves once both are in it: 1 ms from rank 1's wait, not
    9 ms from the send. With rank 1's forward twice as fast it waits at 5 and the message is
    there at 6: the step ends at 20 (rank 1), where a transfer from the send would hold it at
    25."""
    segments = _segments(
        [
            (0, 0, 2, S.FORWARD, S.SEGMENT_COMPUTE, "a"),
            (0, 2, 20, S.BACKWARD, S.SEGMENT_COMPUTE, "b"),
            (1, 0, 10, S.FORWARD, S.SEGMENT_COMPUTE, "c"),
            (1, 10, 11, S.COMM, S.SEGMENT_COMM, "recv"),
            (1, 11, 25, S.BACKWARD, S.SEGMENT_COMPUTE, "d"),
        ]
    )
    calls = _p2p(
        [
            {"rank": 0, "op": "send", "peer": 1, "start": 2, "end": 2, "issued": 2, "last": 2,
             "last_rank": 0},
            {"rank": 1, "op": "recv", "peer": 0, "start": 0, "end": 11, "issued": 0, "last": 2,
             "last_rank": 0, "tid": 8},
        ]
    )  # fmt: skip
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 25 * MS}
    faster_forward = Change("x", item_factor=(graph.items[S.OP] == "c").to_numpy() * -0.5 + 1)
    assert replay(graph, faster_forward).step_ns == {1: 20 * MS}
    assert _walk(segments, calls) == [
        (1, S.FORWARD, S.SEGMENT_COMPUTE, 10.0),
        (1, S.COMM, "transfer", 1.0),
        (1, S.BACKWARD, S.SEGMENT_COMPUTE, 14.0),
    ]


def test_a_send_is_done_when_its_receive_is() -> None:
    """Rank 0 sends at 2 and waits for its send only at the end of the step (28-30: gloo's
    schedule waits for its sends last), while rank 1 had the message at 3. The send's transfer
    ends at 3: with rank 0's backward twice as fast, the step ends at 17, not held at 30."""
    segments = _segments(
        [
            (0, 0, 2, S.FORWARD, S.SEGMENT_COMPUTE, "a"),
            (0, 2, 28, S.BACKWARD, S.SEGMENT_COMPUTE, "b"),
            (0, 28, 30, S.COMM, S.SEGMENT_COMM, "send"),
            (1, 0, 3, S.COMM, S.SEGMENT_COMM, "recv"),
            (1, 3, 10, S.FORWARD, S.SEGMENT_COMPUTE, "c"),
        ]
    )
    calls = _p2p(
        [
            {"rank": 0, "op": "send", "peer": 1, "start": 2, "end": 30, "issued": 2, "last": 2,
             "last_rank": 0},
            {"rank": 1, "op": "recv", "peer": 0, "start": 0, "end": 3, "issued": 0, "last": 2,
             "last_rank": 0, "tid": 8},
        ]
    )  # fmt: skip
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 30 * MS}
    change = faster(graph, S.BACKWARD, 2.0)
    assert change is not None and replay(graph, change).step_ns == {1: 17 * MS}


def test_calls_that_overlap_on_one_thread_are_no_queue() -> None:
    """gloo names the threads of its asynchronous work by ids it reuses: rank 0's receive (1-20)
    and send (2-12) share one, the send ending first. Read as a queue, the send would wait for
    the receive, which waits for rank 0 to reach its wait at 18, after the send's own wait at
    10: a cycle the replay never settles. They are two queues, and the replay reproduces the
    step (22 ms, rank 1)."""
    segments = _segments(
        [
            (0, 0, 10, S.FORWARD, S.SEGMENT_COMPUTE, "a"),
            (0, 10, 12, S.COMM, S.SEGMENT_COMM, "send"),
            (0, 12, 18, S.BACKWARD, S.SEGMENT_COMPUTE, "b"),
            (0, 18, 20, S.COMM, S.SEGMENT_COMM, "recv"),
            (1, 0, 11, S.FORWARD, S.SEGMENT_COMPUTE, "c"),
            (1, 11, 12, S.COMM, S.SEGMENT_COMM, "recv"),
            (1, 12, 22, S.BACKWARD, S.SEGMENT_COMPUTE, "d"),
        ]
    )
    calls = _p2p(
        [
            {"rank": 0, "op": "recv", "peer": 1, "start": 1, "end": 20, "issued": 1, "last": 15,
             "last_rank": 1, "tid": 9},
            {"rank": 0, "op": "send", "peer": 1, "start": 2, "end": 12, "issued": 2, "last": 2,
             "last_rank": 0, "tid": 9},
            {"rank": 1, "op": "recv", "peer": 0, "start": 0, "end": 12, "issued": 0, "last": 2,
             "last_rank": 0, "tid": 9},
            {"rank": 1, "op": "send", "peer": 0, "start": 15, "end": 16, "issued": 15,
             "last": 15, "last_rank": 1, "tid": 8},
        ]
    )  # fmt: skip
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    on_rank_0 = graph.calls.filter(pl.col(S.RANK) == 0)
    assert on_rank_0["queue"].n_unique() == 2
    replayed = replay(graph)
    assert replayed.converged and replayed.step_ns == {1: 22 * MS}


def test_balance_brings_a_slow_rank_to_the_median_and_never_slows_one() -> None:
    """Three ranks compute 10, 10 and 30 ms before an all-reduce of 2 ms: balanced, 12 ms."""
    rows = []
    calls = []
    for rank, work in ((0, 10), (1, 10), (2, 30)):
        rows += [
            (rank, 0, work, S.BACKWARD, S.SEGMENT_COMPUTE, "mm"),
            (rank, work, 32, S.COMM, S.SEGMENT_COMM, "allreduce"),
        ]
        calls.append({"rank": rank, "start": work, "end": 32, "issued": work, "last": 30,
                      "last_rank": 2})  # fmt: skip
    matched = _calls(calls)
    graph = build_graph(_segments(rows), matched, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 32 * MS}
    one = balance_rank(graph, 2)
    assert one is not None and replay(graph, one).step_ns == {1: 12 * MS}
    fast = balance_rank(graph, 0)  # already at the others' median or below: unchanged
    assert fast is not None and replay(graph, fast).step_ns == {1: 32 * MS}
    every = parse_change(graph, "balance")
    assert every is not None and replay(graph, every).step_ns == {1: 12 * MS}


def test_clocks_that_disagree_never_make_the_walk_cycle() -> None:
    """Each rank's wait ends 2 ms after the other's arrival, which lies inside its own wait
    (clocks that disagree). The walk from rank 1's end: its call's last arrival is rank 0's at 8,
    so [8, 10) is rank 1's transfer; on rank 0 at 8, its own call cannot explain the time before
    8 (its last arrival is 8 too), so [0, 8) is rank 0's own waiting, not a jump back to rank 1
    at the same instant (which cycled, and lost the step, on a real 3-rank gloo job in CI)."""
    segments = _segments(
        [(0, 0, 10, S.COMM, S.SEGMENT_COMM, "allreduce"), (1, 0, 10, S.COMM, S.SEGMENT_COMM, "x")]
    )
    calls = _calls(
        [
            {"rank": 0, "start": 0, "end": 10, "issued": 8, "last": 8, "last_rank": 1},
            {"rank": 1, "start": 0, "end": 10, "issued": 8, "last": 8, "last_rank": 0,
             "name": "gloo:other", "tid": 8},
        ]
    )  # fmt: skip
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    (path,) = critical_paths(graph)
    assert path.complete and path.reason is None
    assert [(x.rank, x.kind, x.dur_ns / MS) for x in path.pieces] == [
        (0, "transfer", 8.0),
        (1, "transfer", 2.0),
    ]
    replay(graph)  # settles or gives up after a bounded number of passes, never hangs


def test_a_wait_reached_before_its_call_was_ready_is_the_ranks_own() -> None:
    """Two calls on two queues, issued in different orders (gloo's async work). Rank 0 issues an
    all-reduce at 1, computes until 10, then waits; it issues a broadcast at 15 from inside that
    wait. Rank 1 computes until 4, issues the broadcast, and issues the all-reduce at 12 from
    inside its wait for the broadcast. From rank 0's end (23): the broadcast's transfer [22, 23),
    the all-reduce's transfer back to rank 1's arrival at 12, then rank 1 at 12: inside its wait
    for a broadcast whose last arrival (15) comes after 12, so that call cannot have held it up:
    [4, 12) is rank 1's own waiting, then its compute. (Jumping to rank 0 at 12 instead came
    straight back: the walk cycled and the step was lost.)"""
    segments = _segments(
        [
            (0, 0, 10, S.FORWARD, S.SEGMENT_COMPUTE, "mm"),
            (0, 10, 23, S.COMM, S.SEGMENT_COMM, "allreduce"),
            (1, 0, 4, S.FORWARD, S.SEGMENT_COMPUTE, "mm"),
            (1, 4, 20, S.COMM, S.SEGMENT_COMM, "broadcast"),
        ]
    )
    broadcast = {"op": "broadcast", "name": "gloo:broadcast", "tid": 9}
    calls = _calls(
        [
            {"rank": 0, "start": 10, "end": 22, "issued": 1, "last": 12, "last_rank": 1},
            {"rank": 1, "start": 12, "end": 20, "issued": 12, "last": 12, "last_rank": 1},
            {"rank": 0, "start": 15, "end": 23, "issued": 15, "last": 15, "last_rank": 0}
            | broadcast,
            {"rank": 1, "start": 4, "end": 18, "issued": 4, "last": 15, "last_rank": 0}
            | broadcast,
        ]
    )  # fmt: skip
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    (path,) = critical_paths(graph)
    assert path.complete and path.reason is None
    got = [(x.rank, x.kind, x.start_ns / MS, x.dur_ns / MS) for x in path.pieces if x.dur_ns]
    assert got == [
        (1, S.SEGMENT_COMPUTE, 0.0, 4.0),
        (1, "transfer", 4.0, 8.0),
        (0, "transfer", 12.0, 10.0),
        (0, "transfer", 22.0, 1.0),
    ]


def test_a_wait_released_before_its_calls_span_closed_still_waits_for_it() -> None:
    """gloo's worker can close a call's span after the training thread's wait returned (rank 0:
    the wait ends at 20, the span at 24). The wait [4, 20), cut at no call's end, still waits
    for that call: its last member (rank 1) arrived at 16, inside it. Read as rank 0's own
    time, no what-if could shorten it: rank 1's forward at rank 0's (4 ms, not 16) would still
    end the step at 22 (a 3-rank DDP job's balanced run was predicted 50% high that way). As a
    wait, the all-reduce's transfer is 4 ms (16 to 20): rank 1 issues at 4, both ranks are
    released at 8 and update until 10."""
    segments = _segments(
        [
            (0, 0, 4, S.FORWARD, S.SEGMENT_COMPUTE, "mm"),
            (0, 4, 20, S.COMM, S.SEGMENT_COMM, "allreduce"),
            (0, 20, 22, S.UPDATE, S.SEGMENT_COMPUTE, "add_"),
            (1, 0, 16, S.FORWARD, S.SEGMENT_COMPUTE, "mm"),
            (1, 16, 20, S.COMM, S.SEGMENT_COMM, "allreduce"),
            (1, 20, 22, S.UPDATE, S.SEGMENT_COMPUTE, "add_"),
        ]
    )
    calls = _calls(
        [
            {"rank": 0, "start": 4, "end": 24, "issued": 4, "last": 16, "last_rank": 1},
            {"rank": 1, "start": 16, "end": 20, "issued": 16, "last": 16, "last_rank": 1},
        ]
    )
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 22 * MS}
    one = balance_rank(graph, 1)
    assert one is not None and replay(graph, one).step_ns == {1: 10 * MS}
    (path,) = critical_paths(graph)
    assert [(x.rank, x.kind, x.dur_ns / MS) for x in path.pieces if x.dur_ns] == [
        (1, S.SEGMENT_COMPUTE, 16.0),
        (1, "transfer", 4.0),
        (1, S.SEGMENT_COMPUTE, 2.0),
    ]


def test_a_call_run_in_regions_of_its_own_waits_in_every_one() -> None:
    """TensorFlow runs its ring all-reduce on the calling thread, in regions of its own (a
    ``Loop``, then the call's own end): only the last region holds the call's end. Rank 1 packs
    its gradients (14-16, its own work), issues at 16 (the last to arrive), and is in the call
    until 30 (``Loop`` 16-28, ``allreduce`` 28-30); rank 0 issued at 12. The transfer is the
    14 ms from 16 to 30, all of it in the call's regions: without it, or hidden, both ranks
    are released at 16 and update until 18; twice as fast, at 23 (step 25). Read as rank 1's
    own time, the ``Loop`` kept the replayed step at 30."""
    segments = _segments(
        [
            (0, 0, 10, S.FORWARD, S.SEGMENT_COMPUTE, "mm"),
            (0, 10, 12, S.COMM, S.SEGMENT_COMM, "comm_packing"),
            (0, 12, 13, S.COMM, S.SEGMENT_COMM, "CollectiveOpV2Kernel::Run"),
            (0, 13, 28, S.COMM, S.SEGMENT_COMM, "Loop"),
            (0, 28, 30, S.COMM, S.SEGMENT_COMM, "allreduce"),
            (0, 30, 32, S.UPDATE, S.SEGMENT_COMPUTE, "add_"),
            (1, 0, 14, S.FORWARD, S.SEGMENT_COMPUTE, "mm"),
            (1, 14, 16, S.COMM, S.SEGMENT_COMM, "comm_packing"),
            (1, 16, 28, S.COMM, S.SEGMENT_COMM, "Loop"),
            (1, 28, 30, S.COMM, S.SEGMENT_COMM, "allreduce"),
            (1, 30, 32, S.UPDATE, S.SEGMENT_COMPUTE, "add_"),
        ]
    )
    calls = _calls(
        [
            {"rank": 0, "start": 12, "end": 30, "issued": 12, "last": 16, "last_rank": 1},
            {"rank": 1, "start": 16, "end": 30, "issued": 16, "last": 16, "last_rank": 1},
        ]
    )
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 32 * MS}
    for name in ("without:comm", "hide_comm"):
        change = parse_change(graph, name)
        assert change is not None and replay(graph, change).step_ns == {1: 18 * MS}, name
    twice = parse_change(graph, "faster:allreduce:2")
    assert twice is not None and replay(graph, twice).step_ns == {1: 25 * MS}
    # the path: rank 1's own work, then the call's transfer (named by its collective)
    (path,) = critical_paths(graph)
    assert [(x.rank, x.kind, x.op, x.dur_ns / MS) for x in path.pieces if x.dur_ns] == [
        (1, S.SEGMENT_COMPUTE, "mm", 14.0),
        (1, "transfer", "comm_packing", 2.0),
        (1, "transfer", "allreduce", 12.0),
        (1, "transfer", "allreduce", 2.0),
        (1, S.SEGMENT_COMPUTE, "add_", 2.0),
    ]


def test_communication_without_a_matched_call_marks_the_step_incomplete() -> None:
    """Two ranks of a larger job (the others' traces missing): their communication kernels
    match no call, so what they waited for is unknown. The path still tiles the step, through
    the rank's own communication, and the step says why it is incomplete; a step whose calls
    are all matched is complete."""
    segments = _segments(
        [
            (0, 0, 10, S.FORWARD, S.SEGMENT_KERNEL, "gemm"),
            (0, 10, 30, S.COMM, S.SEGMENT_KERNEL, "allreduce"),
            (1, 0, 12, S.FORWARD, S.SEGMENT_KERNEL, "gemm"),
            (1, 12, 29, S.COMM, S.SEGMENT_KERNEL, "allreduce"),
        ]
    )
    graph = build_graph(segments, Matched(pl.DataFrame()), [1])
    assert graph is not None
    (path,) = critical_paths(graph)
    assert not path.complete and path.reason is not None and "without a matched call" in path.reason
    assert sum(x.dur_ns for x in path.pieces) == 30 * MS
    segments, calls = _two_ranks()
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    (path,) = critical_paths(graph)
    assert path.complete and path.reason is None


def _stretches_one_by_one(pieces: list[PathPiece], step_ns: int) -> list[PathPiece]:
    """The stretches' rule as the report states it, applied a piece at a time: a piece joins
    the stretch before it where it is of the same rank, neither is a late start, and it is of
    the stretch's phase or shorter than 0.5% of the step; the stretch takes the kind and
    operator of its first longest piece."""
    out: list[PathPiece] = []
    longest: list[int] = []
    for x in pieces:
        if x.dur_ns <= 0:
            continue
        last = out[-1] if out else None
        if (
            last is not None
            and last.rank == x.rank
            and LATE_START not in (last.kind, x.kind)
            and (last.phase == x.phase or x.dur_ns < 0.005 * step_ns)
        ):
            if x.dur_ns > longest[-1]:
                last.op, last.kind, longest[-1] = x.op, x.kind, x.dur_ns
            last.dur_ns = x.start_ns + x.dur_ns - last.start_ns
            continue
        out.append(PathPiece(x.rank, x.phase, x.op, x.kind, x.start_ns, x.dur_ns))
        longest.append(x.dur_ns)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_stretches_over_columns_follow_the_rule_piece_by_piece(seed: int) -> None:
    """The path of a long step holds millions of pieces: its stretches are found over columns
    (a Python object a piece took 1 GB on a 1 GB trace of one step), and must be what the rule
    gives piece by piece, on random paths of short, empty and late pieces of a few ranks."""
    import random

    rng = random.Random(seed)
    phases = [None, S.FORWARD, S.BACKWARD, S.IDLE]
    kinds = [S.SEGMENT_COMPUTE, S.SEGMENT_IDLE, LATE_START, S.SEGMENT_KERNEL]
    pieces, t, rank = [], 0, 0
    for _ in range(rng.randrange(0, 200)):
        rank = rank if rng.random() < 0.9 else rng.randrange(3)
        dur = rng.choice([0, 1, 2, 5, 50, 300, 300, 4000])
        kind = rng.choice(kinds) if rng.random() < 0.3 else S.SEGMENT_COMPUTE
        phase = None if kind == LATE_START else rng.choice(phases)
        pieces.append(PathPiece(rank, phase, rng.choice([None, "mm", "conv"]), kind, t, dur))
        t += dur
    step = max(t, 1)
    expected = _stretches_one_by_one([PathPiece(**vars(x)) for x in pieces], step)
    assert _stretches(pieces, step) == expected


def test_stretches_keep_a_short_late_start_apart() -> None:
    """The report's stretches join a rank's pieces of one phase, and a piece under 0.5% of the
    step into the one before it; a late start (no phase) joins nothing. A ddp3-slow run in CI
    began its median step with rank 2 0.1 ms late then 0.2 ms idle (both under 0.5% of 46 ms):
    joined, they read as an idle stretch without a phase."""
    pieces = [
        PathPiece(2, None, None, LATE_START, 0, 100_000),
        PathPiece(2, S.IDLE, None, S.SEGMENT_IDLE, 100_000, 200_000),
        PathPiece(2, S.FORWARD, "linear", S.SEGMENT_COMPUTE, 300_000, 10 * MS),
        PathPiece(2, S.BACKWARD, "mm", S.SEGMENT_COMPUTE, 10_300_000, 100_000),
        PathPiece(2, S.BACKWARD, "mm", S.SEGMENT_COMPUTE, 10_400_000, 35_600_000),
    ]
    got = [(x.phase, x.kind, x.start_ns, x.dur_ns) for x in _stretches(pieces, 46 * MS)]
    assert got == [
        (None, LATE_START, 0, 100_000),
        (S.IDLE, S.SEGMENT_IDLE, 100_000, 200_000),
        (S.FORWARD, S.SEGMENT_COMPUTE, 300_000, 10_100_000),  # the short backward piece joined
        (S.BACKWARD, S.SEGMENT_COMPUTE, 10_400_000, 35_600_000),
    ]


@pytest.mark.parametrize("text", ["faster:x", "balance:rank", "bandwidth:allreduce:-1", "fast"])
def test_a_malformed_change_is_refused(text: str) -> None:
    segments, calls = _two_ranks()
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    with pytest.raises(ValueError):
        parse_change(graph, text)


def test_the_collective_model_recovers_latency_and_bandwidth() -> None:
    """All-reduces of 1 and 4 MB on 2 and 4 ranks, timed as 0.5 ms per other rank plus bus
    bytes at 2 GB/s: the fit gives those back, and predicts 8 ranks from them."""
    from types import SimpleNamespace

    from traceview.analysis.scaling import _comm_at, fit_collectives
    from traceview.model.results import CollectiveSummary, RunReport

    def run(n: int) -> RunReport:
        calls = [
            CollectiveSummary(
                op="allreduce", name="x", group=None, position=i, calls_per_step=1.0, ranks=n,
                bytes=size, transfer_ms=0.5 * (n - 1) + size * 2 * (n - 1) / n / 2e6,
                wait_ms=0.0, skew_ms=0.0, last_rank=0,
            )
            for i, size in enumerate((1_000_000, 4_000_000))
        ]  # fmt: skip
        # (the model reads a report's rank count and collectives only)
        return SimpleNamespace(run=SimpleNamespace(ranks=n), collectives=calls)  # type: ignore[return-value]

    (fit,) = fit_collectives([run(2), run(4)])
    assert fit.latency_ms == pytest.approx(0.5, rel=1e-3)
    assert fit.busbw_gbps == pytest.approx(16.0, rel=1e-3)  # Gb/s: 2 GB/s
    expected = 2 * 0.5 * 7 + 5_000_000 * 2 * 7 / 8 / 2e6
    assert _comm_at(run(4), [fit], 8) == pytest.approx(expected, rel=1e-3)


def _three_steps() -> tuple[pa.Table, Matched]:
    """Three steps of ``_two_ranks`` 100 ms apart (rank 1's forward slower each step), and one
    more all-reduce, issued in step 1 (rank 1 in its forward, rank 0 last, in its wait), that
    rank 0 waits for in step 2 before its second forward: steps 1 and 2 are tied (a faster
    step 1 moves step 2), step 3 is not."""
    tables, calls = [], []
    for step in (1, 2, 3):
        b = (step - 1) * 100
        late = 25 + step
        zero = [(0, b, b + 10, S.FORWARD, S.SEGMENT_COMPUTE, "linear")]
        if step == 2:  # waits until the step-1 call ends at 115, computes again, then reduces
            zero += [
                (0, 110, 115, S.COMM, S.SEGMENT_COMM, "allreduce"),
                (0, 115, 125, S.FORWARD, S.SEGMENT_COMPUTE, "linear"),
            ]
        issue = 125 if step == 2 else b + 10
        tables.append(
            _segments(
                [
                    *zero,
                    (0, issue, b + late + 5, S.COMM, S.SEGMENT_COMM, "allreduce"),
                    (1, b + 5, b + late, S.FORWARD, S.SEGMENT_COMPUTE, "conv"),
                    (1, b + late, b + late + 5, S.COMM, S.SEGMENT_COMM, "allreduce"),
                ],
                step=step,
            )
        )
        for rank, issued in ((0, issue), (1, b + late)):
            calls.append(
                {"rank": rank, "start": issued, "end": b + late + 5, "issued": issued,
                 "last": b + late, "last_rank": 1, "step": step}
            )  # fmt: skip
    for rank, issued in ((0, 28), (1, 24)):
        calls.append(
            {"rank": rank, "start": issued, "end": 115, "issued": issued, "last": 28,
             "last_rank": 0, "step": 1, "position": 1}
        )  # fmt: skip
    frame = _calls(calls).calls.with_columns(
        pl.Series(S.STEP, [c["step"] for c in calls], pl.Int64),
        pl.Series("step_key", [c["step"] for c in calls], pl.Int64),
    )
    return pa.concat_tables(tables), Matched(frame)


def test_steps_walked_and_replayed_in_batches_give_what_one_graph_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for one step a graph, the steps are taken in batches; a step that waits for a
    call of the step before it shares its batch; path, blame, per-step paths, what-ifs and the
    exported path equal one graph's."""
    from traceview.analysis import critical_path as cp

    segments, calls = _three_steps()
    steps: list[int | None] = [1, 2, 3]
    medians = {S.FORWARD: 10.0, S.BACKWARD: 20.0}
    extra = ["faster:conv:2", "balance:rank=1"]
    whole = cp.explain(segments, calls, steps, steps, medians, extra, 2)
    whole_table = cp.path_table(segments, calls, steps)
    source = cp._source(segments, calls, steps, 2)
    assert source is not None and cp._batches(source, source.steps) == [[1, 2, 3]]
    monkeypatch.setattr(cp.source, "GRAPH_ROWS", 1)
    assert cp._batches(source, source.steps) == [[1, 2], [3]]
    batched = cp.explain(segments, calls, steps, steps, medians, extra, 2)
    assert whole.path is not None and whole.path.steps == 3
    assert [w.change for w in whole.whatif][:2] == ["none", "balance"]
    assert batched == whole
    assert cp.path_table(segments, calls, steps).equals(whole_table)
    # counted steps only (the what-ifs over them): step 3 alone, and steps 1-2 without 3
    for counted in ([3], [1, 2]):
        monkeypatch.setattr(cp.source, "GRAPH_ROWS", 1 << 18)
        one = cp.explain(segments, calls, steps, counted, medians, extra, 2)  # type: ignore[arg-type]
        monkeypatch.setattr(cp.source, "GRAPH_ROWS", 1)
        assert cp.explain(segments, calls, steps, counted, medians, extra, 2) == one  # type: ignore[arg-type]


def test_a_warm_up_step_left_out_keeps_the_calls_its_successor_waits_for() -> None:
    """Step 2 waits for an all-reduce of step 1 on a queue of its own, issued last by rank 1;
    with step 1 left out (warm-up), the replay keeps that call's other member and reproduces
    step 2's 40 ms (it read 38 ms when only the calls waited for directly were kept)."""
    tables, calls = [], []
    for step in (1, 2, 3):
        b, late = (step - 1) * 100, 25 + step
        zero = [(0, b, b + 10, S.FORWARD, S.SEGMENT_COMPUTE, "linear")]
        if step == 2:
            zero += [
                (0, 110, 115, S.COMM, S.SEGMENT_COMM, "allreduce"),
                (0, 115, 135, S.FORWARD, S.SEGMENT_COMPUTE, "linear"),
            ]
        issue = 135 if step == 2 else b + 10
        end = 140 if step == 2 else b + late + 5
        last_rank, last = (0, 135) if step == 2 else (1, b + late)
        tables.append(
            _segments(
                [
                    *zero,
                    (0, issue, end, S.COMM, S.SEGMENT_COMM, "allreduce"),
                    (1, b + 5, b + late, S.FORWARD, S.SEGMENT_COMPUTE, "conv"),
                    (1, b + late, end, S.COMM, S.SEGMENT_COMM, "allreduce"),
                ],
                step=step,
            )
        )
        for rank, issued in ((0, issue), (1, b + late)):
            calls.append(
                {"rank": rank, "start": issued, "end": end, "issued": issued, "last": last,
                 "last_rank": last_rank, "step": step}
            )  # fmt: skip
    for rank, issued in ((0, 28), (1, 30)):
        calls.append(
            {"rank": rank, "start": issued, "end": 115, "issued": issued, "last": 30,
             "last_rank": 1, "step": 1, "position": 1, "tid": 8}
        )  # fmt: skip
    frame = _calls(calls).calls.with_columns(
        pl.Series(S.STEP, [c["step"] for c in calls], pl.Int64),
        pl.Series("step_key", [c["step"] for c in calls], pl.Int64),
    )
    segments, matched = pa.concat_tables(tables), Matched(frame)
    graph = build_graph(segments, matched, [2, 3], 2)
    assert graph is not None
    assert replay(graph).step_ns == {2: 40 * MS, 3: 33 * MS}


def test_the_cause_is_read_off_the_steps_whose_paths_are_complete() -> None:
    """Steps 1-3: rank 1 starts 5 ms late, then the two ranks meet in an all-reduce (matched:
    complete paths). Step 4: rank 1 starts 50 ms late, but its all-reduce matched nothing (a
    rank's trace cut short): its path is incomplete, so its late start is no evidence; the
    cause is the late start the complete steps show, 5 ms per step."""
    from traceview.analysis import critical_path as cp

    tables, calls = [], []
    for step in (1, 2, 3, 4):
        b, late = (step - 1) * 100, 50 if step == 4 else 5
        tables.append(
            _segments(
                [
                    (0, b, b + 10, S.FORWARD, S.SEGMENT_COMPUTE, "linear"),
                    (0, b + 10, b + late + 25, S.COMM, S.SEGMENT_COMM, "allreduce"),
                    (1, b + late, b + late + 20, S.BACKWARD, S.SEGMENT_COMPUTE, "conv"),
                    (1, b + late + 20, b + late + 25, S.COMM, S.SEGMENT_COMM, "allreduce"),
                ],
                step=step,
            )
        )
        if step < 4:
            for rank, issued in ((0, b + 10), (1, b + late + 20)):
                calls.append(
                    {"rank": rank, "start": issued, "end": b + late + 25, "issued": issued,
                     "last": b + late + 20, "last_rank": 1, "step": step}
                )  # fmt: skip
    frame = _calls(calls).calls.with_columns(
        pl.Series(S.STEP, [c["step"] for c in calls], pl.Int64),
        pl.Series("step_key", [c["step"] for c in calls], pl.Int64),
    )
    segments, matched = pa.concat_tables(tables), Matched(frame)
    medians = {S.FORWARD: 10.0, S.BACKWARD: 20.0}
    steps: list[int | None] = [1, 2, 3, 4]
    every = cp.explain(segments, matched, steps, steps, medians, None, 2)
    complete = cp.explain(segments, matched, steps, [1, 2, 3], medians, None, 2)
    assert every.path is not None and (every.path.steps, every.path.complete_steps) == (4, 3)
    assert complete.cause is not None and complete.cause.kind == "late_start"
    assert every.cause is not None and every.cause.kind == "late_start"
    assert every.cause.rank == complete.cause.rank == 1
    assert every.cause.blamed_ms == complete.cause.blamed_ms == pytest.approx(5.0)


def test_one_pipeline_stage_balanced_leaves_its_ranks_other_stage_alone() -> None:
    """Interleaved: rank 0 holds stages 0 and 2 (forward 3 ms and 8 ms), rank 1 stages 1 and 3
    (2 ms each); rank 0 updates for 1 ms after, outside every action (no stage's work). Stage 2
    at the other stages' median (2 ms): rank 0 ends at 3 + 2 + 1 = 6 ms; rank 0 as a whole at
    rank 1's forward (4 ms) would shrink stage 0 too, and end at 5."""
    segments = _segments(
        [
            (0, 0, 3, S.FORWARD, S.SEGMENT_COMPUTE, "a"),
            (0, 3, 11, S.FORWARD, S.SEGMENT_COMPUTE, "b"),
            (0, 11, 12, S.UPDATE, S.SEGMENT_COMPUTE, "sgd"),
            (1, 0, 2, S.FORWARD, S.SEGMENT_COMPUTE, "c"),
            (1, 2, 4, S.FORWARD, S.SEGMENT_COMPUTE, "d"),
        ]
    )
    actions = pa.table(
        {
            S.RANK: pa.array([0, 0, 1, 1], pa.int32()),
            S.STEP: pa.array([1] * 4, pa.int64()),
            S.STAGE: pa.array([0, 2, 1, 3], pa.int32()),
            S.ACTION: ["F"] * 4,
            S.MICROBATCH: pa.array([0] * 4, pa.int32()),
            S.START_NS: pa.array([0, 3 * MS, 0, 2 * MS], pa.int64()),
            S.END_NS: pa.array([3 * MS, 11 * MS, 2 * MS, 4 * MS], pa.int64()),
        },
        schema=S.ACTIONS_SCHEMA,
    )
    graph = build_graph(segments, Matched(pl.DataFrame()), [1], actions=actions)
    assert graph is not None
    assert replay(graph).step_ns == {1: 12 * MS}
    stage = parse_change(graph, "balance:stage=2")
    assert stage is not None and replay(graph, stage).step_ns == {1: 6 * MS}
    rank = balance_rank(graph, 0)
    assert rank is not None and replay(graph, rank).step_ns == {1: 5 * MS}
    assert parse_change(graph, "balance:stage=7") is None  # (no such stage)
    assert (
        parse_change(build_graph(segments, Matched(pl.DataFrame()), [1]), "balance:stage=2") is None
    )


def test_an_nccl_kernel_on_an_early_rank_waits_for_the_last_one() -> None:
    """Two GPUs: rank 0's backward kernels end at 5 and its all-reduce kernel runs 5-20, waiting
    for rank 1, whose backward runs until 17 (its all-reduce kernel: 17-20). The early rank's
    kernel holds 12 ms of waiting and 3 of transfer: with rank 1 balanced (its backward at rank
    0's 5 ms) both kernels end at 8, where a kernel kept as measured would hold the step at 20;
    the path is rank 1's backward, then the transfer."""
    segments = _segments(
        [
            (0, 0, 5, S.BACKWARD, S.SEGMENT_KERNEL, "gemm"),
            (0, 5, 20, S.COMM, S.SEGMENT_KERNEL, "ncclKernel_AllReduce"),
            (1, 0, 17, S.BACKWARD, S.SEGMENT_KERNEL, "gemm"),
            (1, 17, 20, S.COMM, S.SEGMENT_KERNEL, "ncclKernel_AllReduce"),
        ]
    )
    calls = _calls(
        [
            {"rank": 0, "name": "ncclKernel_AllReduce", "start": 5, "end": 20, "issued": 5,
             "last": 17, "last_rank": 1},
            {"rank": 1, "name": "ncclKernel_AllReduce", "start": 17, "end": 20, "issued": 17,
             "last": 17, "last_rank": 1},
        ]
    )  # fmt: skip
    graph = build_graph(segments, calls, [1])
    assert graph is not None
    assert replay(graph).step_ns == {1: 20 * MS}
    change = balance_rank(graph, 1)
    assert change is not None and replay(graph, change).step_ns == {1: 8 * MS}
    assert _walk(segments, calls) == [
        (1, S.BACKWARD, S.SEGMENT_KERNEL, 17.0),
        (1, S.COMM, "transfer", 3.0),
    ]


def test_steps_laid_out_at_once_are_walked_as_each_alone() -> None:
    """Many steps of two ranks without a call between them: the steps whose last rank's last
    item ends the step are laid out at once (``walk``), the others walked; every path equals
    the path walked alone, and a plain step's path is its last rank's items after its late
    start."""
    from traceview.analysis.critical_path.walk import walk

    rows = []
    for step in range(1, 41):
        t = step * 100
        late = step % 4  # rank 1 starts 0-3 ms after rank 0
        rows += [
            (0, step, t, t + 20, S.FORWARD, S.SEGMENT_COMPUTE, "a"),
            (1, step, t + late, t + 30, S.FORWARD, S.SEGMENT_COMPUTE, "b"),
            (1, step, t + 30, t + 50 + (step % 3), S.BACKWARD, S.SEGMENT_COMPUTE, None),
        ]
        if step % 5 == 0:  # an item inside another: the last item does not end the rank's step
            rows.append((1, step, t + 31, t + 40, S.BACKWARD, S.SEGMENT_COMPUTE, "inner"))
        if step % 7 == 0:  # an item of no length at the step's end
            rows.append((1, step, t + 50 + (step % 3), t + 50 + (step % 3), S.UPDATE, None, "z"))
        if step % 11 == 0:  # rank 0 ends the step, idle after its items
            rows.append((0, step, t + 20, t + 60, S.UPDATE, S.SEGMENT_COMPUTE, "u"))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    segments = pa.table(
        {
            S.RANK: pa.array([r[0] for r in rows], pa.int32()),
            S.STEP: pa.array([r[1] for r in rows], pa.int64()),
            S.START_NS: pa.array([r[2] * MS for r in rows], pa.int64()),
            S.END_NS: pa.array([r[3] * MS for r in rows], pa.int64()),
            S.PHASE: [r[4] for r in rows],
            S.KIND: [r[5] for r in rows],
            S.OP: pa.array([r[6] for r in rows], pa.string()),
        },
        schema=S.SEGMENTS_SCHEMA,
    )
    steps = list(range(1, 41))
    graph = build_graph(segments, Matched(pl.DataFrame()), steps)
    assert graph is not None
    at_once, alone = walk(graph), walk(graph, at_once=False)
    assert at_once.frame.equals(alone.frame)
    assert at_once.offsets.tolist() == alone.offsets.tolist()
    assert at_once.steps.tolist() == steps
    step_1 = [(x.rank, x.kind, x.start_ns // MS, x.dur_ns // MS) for x in at_once.path(0).pieces]
    assert step_1 == [(1, LATE_START, 100, 1), (1, "compute", 101, 29), (1, "compute", 130, 21)]
    for path in at_once.paths():  # a path tiles its step where the items do not overlap
        if path.step % 5 == 0:
            continue
        assert sum(x.dur_ns for x in path.pieces) == path.end_ns - path.start_ns, path.step


def test_a_step_whose_ranks_never_ran_it_together_is_apart() -> None:
    """Per rank and step, the span of its items: a step is apart where some rank's span ends
    before another's begins (two runs' traces in one folder); overlapping spans, one of no
    length inside another's, or one rank alone are not."""
    from traceview.analysis.critical_path.source import _apart

    spans = pl.DataFrame(
        {
            "rank": [0, 1, 0, 1, 0, 1, 0],
            "step": [1, 1, 2, 2, 3, 3, 4],
            "s": [0, 10, 0, 5, 0, 30, 0],
            "e": [20, 10, 10, 30, 20, 40, 5],
        }
    )
    assert _apart(spans) == [3]
