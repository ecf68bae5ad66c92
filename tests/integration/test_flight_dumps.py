"""Flight Recorder dumps as NCCL writes them (no GPU here: built from the dump format PyTorch
documents: ``version``, ``pg_config``, ``pg_status``, ``entries`` with ``state`` scheduled,
started or completed; pickles named ``nccl_trace_rank_N``), and hostile ones: a pickle that
tries to run code, one cut short, two different dumps of one rank, names with escapes."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from traceview.analysis.failure import analyse_failure
from traceview.parsers.flight import find_dumps

T0 = 1_790_000_000_000_000_000


def _entry(seq: int, state: str = "completed", size: int = 1 << 20, op: str = "all_reduce",
           name: str = "nccl") -> dict[str, Any]:  # fmt: skip
    created = T0 + seq * 1_000_000
    return {
        "record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": f"{name}:{op}", "time_created_ns": created,
        "input_sizes": [[size]], "input_dtypes": ["Float"],
        "output_sizes": [[size]], "output_dtypes": ["Float"], "state": state,
        "time_discovered_started_ns": created + 1000 if state != "scheduled" else None,
        "time_discovered_completed_ns": created + 500_000 if state == "completed" else None,
        "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False,
        "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
    }  # fmt: skip


def _dump(entries: list[dict[str, Any]], world: int = 4) -> dict[str, Any]:
    return {
        "version": "2.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "pg_status": {"0": {"last_enqueued_collective": entries[-1]["collective_seq_id"]}},
        "entries": entries,
        "nccl_comm_state": {},
        "comm_lib_version": "2.21.5",
    }


def _write(folder: Path, rank: int, dump: dict[str, Any], form: str = "pickle") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if form == "pickle":
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(dump, protocol=2))
    else:
        path = folder / f"dump_{rank}.json"
        path.write_text(json.dumps(dump))
    return path


def _analysed(folder: Path) -> Any:
    found = find_dumps(sorted(folder.iterdir()))
    assert found is not None
    return found, analyse_failure(found.steps, found.calls, found.ranks)


def test_an_nccl_hang_names_the_rank_that_never_made_the_call(tmp_path: Path) -> None:
    done = [_entry(s) for s in range(1, 11)]
    for rank in (0, 1, 3):  # in call 11, started, never completed
        _write(tmp_path, rank, _dump([*done, _entry(11, "started"), _entry(12, "scheduled")]))
    _write(tmp_path, 2, _dump(done))
    _, result = _analysed(tmp_path)
    f = result.failure
    assert (f.kind, f.rank, f.seq, f.op, f.group) == ("hang", 2, 11, "all_reduce", "0")
    assert f.waiting == [0, 1, 3]
    states = {a.rank: (a.state, a.last_seq) for a in result.ranks_at_end}
    assert states == {0: ("blocked", 11), 1: ("blocked", 11), 2: ("stuck", 10), 3: ("blocked", 11)}


def test_an_nccl_size_mismatch_names_the_rank_whose_call_differs(tmp_path: Path) -> None:
    done = [_entry(s) for s in range(1, 7)]
    for rank in range(4):
        size = (1 << 20) + (256 if rank == 3 else 0)
        _write(tmp_path, rank, _dump([*done, _entry(7, "started", size=size)]), form="json")
    _, result = _analysed(tmp_path)
    f = result.failure
    assert (f.kind, f.rank, f.seq) == ("mismatch", 3, 7)
    # (2**20 + 256 floats: 4,195,328 bytes, against 4,194,304)
    assert "all_reduce (4097 KiB) where the others called all_reduce (4096 KiB)" in f.detail


def test_a_skipped_call_of_equal_shape_is_a_desync_where_the_call_sites_part(
    tmp_path: Path,
) -> None:
    """Each step makes two all-reduces of one size from two places (gradients at train.py:40,
    a metric at train.py:50); rank 2 leaves out the metric of call 6 and runs one call ahead:
    NCCL pairs the wrong calls silently, then the others wait in a call it never makes. Its
    dump alone looks like a hang; the call sites show where the sequences part."""

    def call(seq: int, state: str = "completed") -> dict[str, Any]:
        line = 40 if seq % 2 else 50
        entry = _entry(seq, state)
        entry["frames"] = [
            {"name": "all_reduce", "filename": "/x/site-packages/torch/distributed/c10d.py",
             "line": 2500},
            {"name": "train_step", "filename": "/job/train.py", "line": line},
        ]  # fmt: skip
        return entry

    others = [call(s) for s in range(1, 11)] + [call(11, "started")]
    skipped = [call(s) for s in (*range(1, 6), *range(7, 12))]  # its seq 6 is their 7th call
    for seq, entry in enumerate(skipped, start=1):
        entry["collective_seq_id"] = seq
    for rank in (0, 1, 3):
        _write(tmp_path, rank, _dump(others))
    _write(tmp_path, 2, _dump(skipped))
    _, result = _analysed(tmp_path)
    f = result.failure
    assert (f.kind, f.rank, f.seq) == ("desync", 2, 6), f.detail
    assert "at train.py:50 in train_step" in f.detail and "at train.py:40" in f.detail


def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path: Path) -> None:
    mark = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {mark}",))

    dumps = tmp_path / "dumps"
    done = [_entry(s) for s in range(1, 4)]
    for rank in (0, 1):
        _write(dumps, rank, _dump(done, world=3))
    evil = _dump(done, world=3)
    evil["nccl_comm_state"] = Payload()
    (dumps / "nccl_trace_rank_2").write_bytes(pickle.dumps(evil, protocol=2))
    found, _ = _analysed(dumps)
    assert not mark.exists()
    assert sorted(found.dumps) == [0, 1]
    assert any("nccl_trace_rank_2" in w and "refused, not executed" in w for w in found.warnings)
    result = run_cli("report", dumps)
    assert result.code == 0 and not mark.exists()
    assert "refused, not executed" in result.out + result.err


def test_damaged_and_contradicting_dumps_are_set_aside_with_a_warning(tmp_path: Path) -> None:
    done = [_entry(s) for s in range(1, 6)]
    whole = pickle.dumps(_dump(done), protocol=2)
    (tmp_path / "nccl_trace_rank_0").write_bytes(whole[: len(whole) // 2])  # cut short
    _write(tmp_path, 1, _dump(done))
    _write(tmp_path, 1, _dump([*done, _entry(6)]), form="json")  # a later, different dump
    bad = _dump(done)
    bad["entries"] = [*done, {"collective_seq_id": "x", "profiling_name": 5}, "not an entry"]
    _write(tmp_path, 2, bad)
    found, result = _analysed(tmp_path)
    assert sorted(found.dumps) == [1, 2]
    said = " ".join(found.warnings)
    assert "nccl_trace_rank_0" in said and "set aside" in said
    assert "rank 1: two different Flight Recorder dumps" in said and "dump_1.json" in said
    assert found.dumps[1].path.name == "dump_1.json"
    assert found.calls.num_rows == 6 + 5  # (rank 2's odd entries left out)
    # (the groups name ranks 0-3: those without a readable dump are named, their state unknown)
    assert "no Flight Recorder dump of rank(s) 0, 3" in said
    states = {a.rank: a.state for a in result.ranks_at_end}
    assert states == {0: "unknown", 1: "running", 2: "running", 3: "unknown"}
    assert result.failure is None  # (no rank waited in a call: nothing the dumps show)


def test_a_rank_without_a_dump_is_named_when_the_others_wait_for_it(tmp_path: Path) -> None:
    """NCCL's watchdog dumps every rank it can; rank 2 died hard and left none: the others
    wait in call 11, which none of them is behind in."""
    done = [_entry(s) for s in range(1, 11)]
    for rank in (0, 1, 3):
        _write(tmp_path, rank, _dump([*done, _entry(11, "started")]))
    found, result = _analysed(tmp_path)
    assert any("no Flight Recorder dump of rank(s) 2" in w for w in found.warnings)
    f = result.failure
    assert (f.kind, f.rank, f.seq, f.waiting) == ("hang", 2, 11, [0, 1, 3])
    assert "rank 2 left no Flight Recorder dump" in f.detail


def test_names_in_a_dump_are_shown_escaped(tmp_path: Path) -> None:
    done = [_entry(s) for s in range(1, 4)]
    for rank in (0, 1):
        _write(tmp_path, rank, _dump([*done, _entry(4, "started", op="all\x1b[2Jreduce")], 3))
    _write(tmp_path, 2, _dump(done, 3))
    result = run_cli("report", tmp_path)
    assert result.code == 0, result.err
    assert "\x1b[2J" not in result.out and "rank 2 was stuck" in result.out


def test_a_folder_of_only_a_refused_pickle_says_so_in_one_line(tmp_path: Path) -> None:
    mark = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {mark}",))

    evil = _dump([_entry(1)], world=1)
    evil["entries"] = [Payload()]
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(evil, protocol=2))
    result = run_cli("report", tmp_path)
    assert result.code == 2 and not mark.exists()
    assert len(result.err.strip().splitlines()) == 1
    assert "no traces found" in result.err and "refused, not executed" in result.err


# --- entries as PyTorch's own analyser's tests write them -----------------------------------
# (torch.distributed.flight_recorder's test_fr_analysis.py: sequence numbers as strings, one
# dtype string for all inputs, a subgroup named alike on every rank but holding only that rank,
# and coalesced calls: each op, then a "coalesced" entry, all of one sequence number)


def _fr_entry(record: int, op: str, sizes: list[list[int]], seq: int,
              group: tuple[str, str] = ("0", "default_pg"), dtype: str = "float32",
              state: str = "completed") -> dict[str, Any]:  # fmt: skip
    return {
        "record_id": record, "profiling_name": f"gloo:{op}", "state": state,
        "process_group": group, "input_sizes": sizes, "output_sizes": sizes,
        "input_dtypes": dtype, "output_dtypes": dtype, "collective_seq_id": str(seq),
        "p2p_seq_id": "0", "time_created_ns": T0 + record * 1000, "frames": [],
        "is_p2p": False,
    }  # fmt: skip


def _fr_dump(rank: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "version": "2.8",
        "rank": rank,
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
            "1": {"name": "1", "desc": "sub_pg", "ranks": f"[{rank}]"},
        },
        "entries": entries,
    }


def _fr_job(tmp_path: Path, second: dict[int, list[list[int]]]) -> Any:
    """Two ranks: an all-reduce, an all-reduce of each rank's own subgroup, then a coalesced
    broadcast of two tensors (sizes of the second: ``second[rank]``)."""
    for rank in (0, 1):
        entries = [
            _fr_entry(0, "all_reduce", [[4, 4]], 1),
            _fr_entry(1, "all_reduce", [[5, 5]], 1, group=("1", "sub_pg")),
            _fr_entry(2, "_broadcast_oop", [[4, 4]], 2),
            _fr_entry(3, "_broadcast_oop", second[rank], 2),
            _fr_entry(4, "ALLGATHER_coalesced", [[]], 2),
        ]
        _write(tmp_path, rank, _fr_dump(rank, entries), form="json")
    return _analysed(tmp_path)


def test_pytorch_analyser_entries_that_match_are_no_failure(tmp_path: Path) -> None:
    found, result = _fr_job(tmp_path, {0: [[4, 4]], 1: [[4, 4]]})
    assert result.failure is None, result.failure
    calls = found.calls.to_pylist()
    # string sequence numbers read; the coalesced call is one call of both tensors' bytes
    coalesced = [c for c in calls if c["seq"] == 2]
    assert len(coalesced) == 2 and {c["op"] for c in coalesced} == {"ALLGATHER_coalesced"}
    assert {c["bytes"] for c in coalesced} == {2 * 16 * 4}
    # each rank's one-rank subgroup is its own group, not one group the other rank skipped
    assert {c["group"] for c in calls if c["rank"] == 0} == {"0", "1 (ranks 0)"}
    assert {c["group"] for c in calls if c["rank"] == 1} == {"0", "1 (ranks 1)"}


def test_pytorch_analyser_entries_of_a_coalesced_call_that_differs_are_a_mismatch(
    tmp_path: Path,
) -> None:
    """Rank 0 broadcasts a 5x5 tensor where rank 1 broadcasts a 4x4 one, inside one coalesced
    call (the analyser's "mis-matched uneven all-gather" case)."""
    _, result = _fr_job(tmp_path, {0: [[5, 5]], 1: [[4, 4]]})
    f = result.failure
    assert f is not None and (f.kind, f.seq, f.group) == ("mismatch", 2, "0"), f
    assert f.rank in (0, 1) and "ALLGATHER_coalesced" in f.detail, f.detail


def test_entries_whose_sequence_numbers_go_back_are_set_aside(tmp_path: Path) -> None:
    """A ring holding calls of another run after this one's: the entries whose sequence number
    goes back are set aside, named in one warning; the rest still shows the hang."""
    done = [_entry(s) for s in range(1, 11)]
    stale = [_entry(s) for s in (3, 4)]  # (not one call's entries: they do not follow it)
    for rank in (0, 1, 3):
        _write(tmp_path, rank, _dump([*done, _entry(11, "started"), *stale]))
    _write(tmp_path, 2, _dump(done))
    found, result = _analysed(tmp_path)
    assert sum("sequence number goes back" in w for w in found.warnings) == 3, found.warnings
    f = result.failure
    assert (f.kind, f.rank, f.seq) == ("hang", 2, 11), f


def test_a_dump_whose_rank_is_no_rank_number_is_read_by_its_name(tmp_path: Path) -> None:
    """A dump's ``rank`` out of range, negative or not a number: read as the rank its file name
    ends with, said in a warning; where the name gives none either (a number wider than a
    rank's), set aside."""
    done = [_entry(s) for s in range(1, 4)]
    for rank, said in ((0, 2**70), (1, -1), (2, True)):
        _write(tmp_path, rank, {**_dump(done, world=3), "rank": said})
    wide = tmp_path / f"nccl_trace_rank_{2**70}"
    wide.write_bytes(pickle.dumps({**_dump(done, world=3), "rank": "x"}, protocol=2))
    found, _ = _analysed(tmp_path)
    assert sorted(found.dumps) == [0, 1, 2]
    said = found.warnings
    assert sum("is no rank number; read as rank" in w for w in said) == 3, said
    assert any(wide.name in w and "set aside" in w for w in said), said
    result = run_cli("report", "--json", tmp_path)
    assert result.code == 0, result.err


def test_a_dump_of_more_entries_than_read_keeps_its_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pickle of a few bytes a reference can hold millions of entries: the newest are read,
    the others named in a warning."""
    from traceview.parsers import flight

    monkeypatch.setattr(flight, "MAX_ENTRIES", 4)
    _write(tmp_path, 0, _dump([_entry(s) for s in range(1, 11)], world=1))
    found, _ = _analysed(tmp_path)
    assert [e["collective_seq_id"] for e in found.dumps[0].entries] == [7, 8, 9, 10]
    assert any("6 older entries set aside (its newest 4 read)" in w for w in found.warnings)
