"""Process groups, point-to-point pairs and pipelines (issue 32) on small tables whose answers are
worked out by hand; the real jobs are in tests/live/test_parallel_jobs.py."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from traceview.analysis.collectives import _fifo
from traceview.analysis.crossrank import CrossRank, Matched, estimate_clocks, match_collectives
from traceview.analysis.groups import declared_groups, dimension
from traceview.model import schema as S
from traceview.model.columns import decode_ranks, encode_ranks


@pytest.mark.parametrize(
    "ranks",
    [[0], [0, 1, 2, 3], [0, 8, 16, 24], [1, 3, 9], [0, 1, 2, 5, 7, 9, 11], list(range(0, 1024, 2))],
)
def test_ranks_encode_and_decode(ranks: list[int]) -> None:
    text = encode_ranks(ranks)
    assert decode_ranks(text) == ranks
    assert len(text) < 40  # (compact: one run per progression)


def test_fifo_links_each_run_to_the_earliest_issue_not_taken() -> None:
    # issues at 0 and 10; runs at 5 (issue 0), 12 (issue 10), 13 (none left: issued before)
    assert _fifo(np.array([0, 10]), np.array([5, 12, 13])).tolist() == [0, 1, -1]
    # a run before any issue (its issue was before the trace began) takes none
    assert _fifo(np.array([10]), np.array([5, 12])).tolist() == [-1, 0]


def test_mesh_dimension_from_the_group_description() -> None:
    assert dimension("mesh_tp") == "tp"
    assert dimension("mesh_dp_cp") == "dp_cp"
    assert dimension("default_pg") is None and dimension(None) is None


def _pg(name: str, desc: str, ranks: list[int]) -> dict[str, str]:
    return {"name": name, "desc": desc, "ranks": encode_ranks(ranks)}


@pytest.mark.parametrize("text", ["0,1</script>", "0-99999999999", "x", "0-3/0", "-1"])
def test_ranks_a_manifest_declares_that_do_not_read_are_bad_input(text: str) -> None:
    """A run directory's manifest is untrusted: group ranks that are no ranks text, or name
    billions of ranks, are one line (exit 2), never an internal error or a list of billions."""
    from traceview.model.errors import BadInput

    with pytest.raises(BadInput, match="its ranks in the run's manifest"):
        declared_groups({0: [{"name": "0", "desc": "default_pg", "ranks": text}]}, 2)


def test_declared_groups_are_the_union_of_the_ranks_declarations() -> None:
    world = _pg("0", "default_pg", [0, 1, 2, 3])
    declared = {
        0: [world, _pg("1", "mesh_dp", [0, 2]), _pg("3", "mesh_tp", [0, 1])],
        1: [world, _pg("2", "mesh_dp", [1, 3]), _pg("3", "mesh_tp", [0, 1])],
        2: [world, _pg("1", "mesh_dp", [0, 2]), _pg("4", "mesh_tp", [2, 3])],
        3: [world, _pg("2", "mesh_dp", [1, 3]), _pg("4", "mesh_tp", [2, 3])],
    }
    groups = declared_groups(declared, 4)
    assert [(g.name, g.dim, g.ranks) for g in groups.groups] == [
        ("0", None, [0, 1, 2, 3]),
        ("1", "dp", [0, 2]),
        ("2", "dp", [1, 3]),
        ("3", "tp", [0, 1]),
        ("4", "tp", [2, 3]),
    ]
    assert groups.warnings == []
    assert sorted(groups.several) == [0, 1, 2, 3]


def test_disagreeing_and_impossible_groups_are_one_warning_each() -> None:
    declared = {
        0: [_pg("1", "", [0, 1]), _pg("9", "", [0, 7])],
        1: [_pg("1", "", [1, 2])],
    }
    groups = declared_groups(declared, 2)
    assert len(groups.warnings) == 2
    assert "different ranks" in groups.warnings[0] and "1" in groups.warnings[0]
    assert "1 rank(s) disagree" in groups.warnings[0]
    assert "beyond the world of 2" in groups.warnings[1]
    assert [g.ranks for g in groups.groups if g.name == "1"] == [[0, 1]]  # the first kept


def test_a_declaration_every_rank_repeats_gives_each_rank_its_own_groups() -> None:
    """Every rank declares every group (equal lists, read once): each rank is a member of its
    own; ranks 2 and 3 repeat a declaration that disagrees with rank 0's: both are counted."""
    every = [
        _pg("0", "default_pg", [0, 1, 2, 3]),
        _pg("1", "mesh_dp", [0, 2]),
        _pg("2", "mesh_dp", [1, 3]),
        _pg("3", "mesh_tp", [0, 1]),
        _pg("4", "mesh_tp", [2, 3]),
    ]
    dissent = [*every[:4], _pg("4", "mesh_tp", [2, 3, 1])]
    groups = declared_groups({0: every, 1: list(every), 2: dissent, 3: list(dissent)}, 4)
    assert groups.of_rank == {
        0: ["0", "1", "3"],
        1: ["0", "2", "3"],
        2: ["0", "1", "4"],
        3: ["0", "2", "4"],
    }
    assert "2 rank(s) disagree" in groups.warnings[0]
    assert [g.ranks for g in groups.groups if g.name == "4"] == [[2, 3]]


def _calls(rows: list[tuple]) -> pa.Table:
    """Collective calls: (rank, name, collective, group, peer, step, issued, start, end), ns."""
    columns = list(zip(*rows, strict=True))
    table = pa.table(
        {
            S.RANK: pa.array(columns[0], pa.int32()),
            S.STEP: pa.array(columns[5], pa.int64()),
            S.DEVICE: ["cpu"] * len(rows),
            S.PID: pa.array([1] * len(rows), pa.int64()),
            S.TID: pa.array([1] * len(rows), pa.int64()),
            S.NAME: list(columns[1]),
            S.COLLECTIVE: list(columns[2]),
            S.GROUP: pa.array(columns[3], pa.string()),
            S.SEQ: pa.array(range(len(rows)), pa.int64()),
            S.START_NS: pa.array(columns[7], pa.int64()),
            S.END_NS: pa.array(columns[8], pa.int64()),
            S.ISSUED_NS: pa.array(columns[6], pa.int64()),
            S.PEER: pa.array(columns[4], pa.int32()),
        }
    )
    return S.conform(table, S.COLLECTIVES_SCHEMA)


def test_a_receive_waits_until_its_send_was_issued() -> None:
    # rank 0 sends to 1 at 100 (its gloo span ends at 900: gloo finishing it);
    # rank 1 posted its receive at 20, the data arrived at 130
    calls = _calls(
        [
            (0, "gloo:send", "send", None, 1, 0, 100, 101, 900),
            (1, "gloo:recv", "recv", None, 0, 0, 20, 21, 130),
        ]
    )
    matched = match_collectives(calls).calls.sort(S.RANK)
    send, recv = matched.row(0, named=True), matched.row(1, named=True)
    assert recv["wait_ns"] == 80 and recv["transfer_ns"] == 30 and recv["last_rank"] == 0
    # the send waited for nothing; it moved data until the receive ended (130), then queued
    assert send["wait_ns"] == 0 and send["transfer_ns"] == 30 and send["queued_ns"] == 770
    assert matched["participants"].to_list() == [2, 2]


def test_point_to_point_is_never_a_collective_of_the_world() -> None:
    # four ranks, two pairs (0->1, 2->3) at the same place of the step: two matches of two
    calls = _calls(
        [
            (0, "gloo:send", "send", None, 1, 0, 0, 0, 50),
            (1, "gloo:recv", "recv", None, 0, 0, 0, 0, 50),
            (2, "gloo:send", "send", None, 3, 0, 0, 0, 90),
            (3, "gloo:recv", "recv", None, 2, 0, 40, 40, 90),
        ]
    )
    matched = match_collectives(calls)
    assert matched.calls.height == 4 and not matched.unmatched
    assert set(matched.calls["participants"].to_list()) == {2}
    three = matched.calls.filter(pl.col(S.RANK) == 2).row(0, named=True)
    assert three["wait_ns"] == 40 and three["last_rank"] == 3


def test_a_call_without_its_peer_is_left_unmatched() -> None:
    calls = _calls(
        [
            (0, "gloo:send", "send", None, 1, 0, 0, 0, 50),
            (1, "gloo:recv", "recv", None, None, 0, 0, 0, 50),
        ]
    )
    matched = match_collectives(calls)
    assert matched.calls.height == 0
    # rank 1's receive names no peer: counted apart (its own warning); rank 0's send then has
    # no partner
    assert matched.no_peer == {1: 1}
    assert matched.unmatched == {0: 1}


def test_a_collective_is_matched_only_inside_its_group() -> None:
    world = _pg("0", "default_pg", [0, 1, 2, 3])
    declared = {
        r: [world, _pg("3" if r < 2 else "4", "mesh_tp", [0, 1] if r < 2 else [2, 3])]
        for r in range(4)
    }
    groups = declared_groups(declared, 4)
    # each tensor-parallel pair all-reduces once; pair (2, 3) is 70 ns later
    calls = _calls(
        [
            (0, "gloo:all_reduce", "allreduce", "3", None, 0, 0, 0, 20),
            (1, "gloo:all_reduce", "allreduce", "3", None, 0, 10, 10, 20),
            (2, "gloo:all_reduce", "allreduce", "4", None, 0, 70, 70, 100),
            (3, "gloo:all_reduce", "allreduce", "4", None, 0, 90, 90, 100),
        ]
    )
    matched = match_collectives(calls, groups).calls.sort(S.RANK)
    assert matched["participants"].to_list() == [2, 2, 2, 2]
    assert matched["last_rank"].to_list() == [1, 1, 3, 3]
    assert matched["wait_ns"].to_list() == [10, 0, 20, 0]


def test_a_call_without_its_peer_is_one_warning_with_counts() -> None:
    from traceview.analysis.summary import _no_peer

    matched = Matched(pl.DataFrame(), no_peer={1: 3, 4: 1})
    [warning] = _no_peer(CrossRank(matched, pl.DataFrame(), None))  # type: ignore[arg-type]
    assert warning.startswith("4 point-to-point call(s) do not say their peer")
    assert "rank 1: 3, rank 4: 1" in warning


def _pipeline_messages(offsets: dict[int, int], chain: list[int]) -> pa.Table:
    """Steps of a pipeline over ``chain`` on one true clock, each rank's times read on a clock
    ``offsets[rank]`` ns ahead: a forward message down the chain then a backward one up it.
    Every receive is posted before its send and ends 30 ns after it (the transfer)."""
    rows = []
    for step in range(3):
        t = step * 10_000
        for k, (a, b) in enumerate(itertools.pairwise(chain)):
            sent = t + 1_000 * k + 500
            rows += [
                (a, "gloo:send", "send", None, b, step, sent + offsets[a], sent + offsets[a], sent + 30 + offsets[a]),
                (b, "gloo:recv", "recv", None, a, step, t + offsets[b], t + offsets[b], sent + 30 + offsets[b]),
            ]  # fmt: skip
        for k, (a, b) in enumerate(itertools.pairwise(chain[::-1])):
            sent = t + 5_000 + 1_000 * k + 500
            rows += [
                (a, "gloo:send", "send", None, b, step, sent + offsets[a], sent + offsets[a], sent + 30 + offsets[a]),
                (b, "gloo:recv", "recv", None, a, step, t + 5_000 + offsets[b], t + 5_000 + offsets[b], sent + 30 + offsets[b]),
            ]  # fmt: skip
    return _calls(rows)


def test_point_to_point_pairs_give_the_clocks_of_a_pipeline() -> None:
    """No synchronizing collective: each pair of neighbours sent both ways, so a receive's end
    less its send's issue bounds their offset from above one way and from below the other; the
    middle is the offset (here exactly: transfers are equal both ways), chained stage to stage."""
    offsets = {0: 0, 1: 7_000_000, 2: -3_250_000, 3: 120_000}
    fit = estimate_clocks(match_collectives(_pipeline_messages(offsets, [0, 1, 2, 3])))
    assert fit is not None and fit.reference == 0 and fit.unaligned == []
    assert fit.offset_ns == {r: pytest.approx(o, abs=1) for r, o in offsets.items()}
    assert all(d == 0 for d in fit.drift.values())


def test_one_way_messages_do_not_give_an_offset() -> None:
    """Messages one way only bound the offset from one side: no estimate."""
    offsets = {0: 0, 1: 5_000}
    calls = _pipeline_messages(offsets, [0, 1])
    df = pl.from_arrow(calls)
    assert isinstance(df, pl.DataFrame)
    forward = df.filter(
        ((pl.col(S.RANK) == 0) & (pl.col(S.COLLECTIVE) == "send"))
        | ((pl.col(S.RANK) == 1) & (pl.col(S.COLLECTIVE) == "recv"))
    )
    assert estimate_clocks(match_collectives(forward.to_arrow())) is None


def test_ranks_that_share_no_call_with_the_reference_are_reached_through_their_groups() -> None:
    """A 2 x 2 mesh on four hosts: rank 3 shares no group with rank 0 (tp pairs {0, 1}, {2, 3};
    dp pairs {0, 2}, {1, 3}); its offset is its dp partner's plus its own against that partner."""
    offsets = {0: 0, 1: 40_000, 2: -25_000, 3: 90_000}
    groups = {"tp0": [0, 1], "tp1": [2, 3], "dp0": [0, 2], "dp1": [1, 3]}
    rows = []
    for step in range(4):
        for i, (name, members) in enumerate(groups.items()):
            start = step * 100_000 + i * 10_000
            for r in members:  # all leave together at start + 2,000 on the true clock
                at = start + 100 * r
                rows.append((r, "gloo:all_reduce", "allreduce", name, None, step,
                             at + offsets[r], at + offsets[r], start + 2_000 + offsets[r]))  # fmt: skip
    fit = estimate_clocks(match_collectives(_calls(rows)))
    assert fit is not None and fit.unaligned == []
    assert fit.offset_ns == {r: pytest.approx(o, abs=1) for r, o in offsets.items()}


def test_groups_of_the_same_members_are_one_for_matching() -> None:
    """DeepSpeed (and the 300-rank gloo job among the shared traces) create several groups of the
    whole world; a gloo call names none of them, and none can be told from another by its calls:
    they are one group for matching, and every call is matched."""
    from traceview.analysis.groups import assign_groups

    declared = {r: [_pg("0", "default_pg", [0, 1]), _pg("1", "", [0, 1])] for r in range(2)}
    groups = declared_groups(declared, 2)
    assert groups.several == [] and groups.alike == {"0": "0", "1": "0"}
    calls = _calls(
        [
            (0, "gloo:all_gather", "allgather", None, None, 0, 0, 0, 20),
            (1, "gloo:all_gather", "allgather", None, None, 0, 5, 5, 20),
        ]
    )
    assigned, left = assign_groups(calls, groups)
    assert left == 0 and assigned.column(S.GROUP).to_pylist() == ["0", "0"]
    matched = match_collectives(assigned, groups)
    assert matched.calls.height == 2 and not matched.unmatched


def test_pipelining_annotations_place_virtual_stages() -> None:
    """torch.distributed.pipelining names each action PP:<stage><F|B|I|W><micro-batch>; its
    communication actions (SEND_F, RECV_B...) and other regions say nothing of the placement."""
    from traceview.analysis.pipeline import VirtualStages, annotated_stages

    names = {
        0: ["PP:0F0", "PP:0F1", "PP:2F0", "PP:2B1", "PP:0SEND_F0", "PP:0UNSHARD", "Forward 0"],
        1: ["PP:1F0", "PP:3F1", "PP:3I0", "PP:1W1", "PP:3RECV_F0", "PP:12F1x"],
        2: ["aten::mm"],
    }
    # each name once in each of two steps, 1 ms and 3 ms: 2 ms per step
    ops = pl.DataFrame(
        [
            (rank, step, name, ns)
            for rank, listed in names.items()
            for name in listed
            for step, ns in ((4, 1_000_000), (5, 3_000_000))
        ],
        schema={S.RANK: pl.Int32, S.STEP: pl.Int64, S.NAME: pl.String, S.TOTAL_NS: pl.Int64},
        orient="row",
    )
    found = annotated_stages(ops)
    assert found == {
        0: VirtualStages((0, 2), 2, False, {0: (4.0, 0.0), 2: (2.0, 2.0)}),
        # (I and W: the backward split in two)
        1: VirtualStages((1, 3), 2, True, {1: (2.0, 2.0), 3: (2.0, 2.0)}),
    }


def test_a_virtual_stage_works_only_where_its_action_computes() -> None:
    """A stage's own work is the compute inside its actions: stage 2's forward action holds a
    4 ms wait for its input (a recv, no compute) before 6 ms of compute; stage 0's 3 ms of
    compute; a compute segment outside every action (the update) is no stage's."""
    from traceview.analysis.pipeline import stage_work
    from traceview.model.columns import TableOnDemand

    ms = 1_000_000
    actions = pa.table(
        {
            S.RANK: pa.array([0, 0], pa.int32()),
            S.STEP: pa.array([7, 7], pa.int64()),
            S.STAGE: pa.array([0, 2], pa.int32()),
            S.ACTION: ["F", "F"],
            S.MICROBATCH: pa.array([0, 0], pa.int32()),
            S.START_NS: [0, 10 * ms],
            S.END_NS: [3 * ms, 20 * ms],
        }
    )
    segments = pa.table(
        {
            S.RANK: pa.array([0, 0, 0, 0], pa.int32()),
            S.STEP: pa.array([7, 7, 7, 7], pa.int64()),
            S.START_NS: [0, 10 * ms, 14 * ms, 20 * ms],
            S.END_NS: [3 * ms, 14 * ms, 20 * ms, 22 * ms],
            S.PHASE: ["forward", "comm", "forward", "update"],
            S.KIND: ["compute", "comm", "compute", "compute"],
            S.OP: [None, None, None, None],
        }
    )
    work = stage_work(actions, TableOnDemand.of(segments), [7])
    assert work == {(0, 0): (3.0, 0.0), (0, 2): (6.0, 0.0)}


def test_a_groups_call_is_marked_on_its_own_ranks_only() -> None:
    """Two tensor-parallel pairs ({0, 1}, {2, 3}) each all-reduce "tp" at the same place in the
    step: two calls, each with its own pair's arrivals and last rank, not one call of four."""
    from traceview.analysis.crossrank.aggregate import step_collectives

    rows = [  # rank, group, arrival, last rank, skew
        (0, "tp0", 100, 1, 30), (1, "tp0", 130, 1, 30),
        (2, "tp1", 105, 2, 5), (3, "tp1", 100, 2, 5),
    ]  # fmt: skip
    table = pa.table(
        {
            S.STEP: pa.array([4] * 4, pa.int64()),
            S.GROUP: [g for _, g, *_ in rows],
            S.NAME: ["gloo:all_reduce"] * 4,
            S.COLLECTIVE: ["allreduce"] * 4,
            "position": [0] * 4,
            "matched": [True] * 4,
            "skew_ns": [s for *_, s in rows],
            "last_rank": pa.array([r for *_, r, _ in rows], pa.int32()),
            S.RANK: pa.array([r for r, *_ in rows], pa.int32()),
            "arrival_ns": [a for _, _, a, *_ in rows],
        }
    )
    calls = step_collectives(table)[4]
    assert [(c.group, c.last_rank, c.arrivals) for c in calls] == [
        ("tp0", 1, {0: 100, 1: 130}),  # (the most skewed first)
        ("tp1", 2, {2: 105, 3: 100}),
    ]
