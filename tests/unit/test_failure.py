"""Issue 49: the step record, written by the rank side's own writer (collectors/rankside_record.py,
in this process, one folder per rank) and read back (parsers/record.py), and the failure read
from it (analysis/failure.py): which rank, which step, which call. The jobs are played call by
call in lockstep, as gloo pairs them; the live jobs (tests/live/test_failures.py) do it for real.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from traceview.analysis.failure import analyse_failure
from traceview.collectors import rankside_record as W
from traceview.model.results import RankTail
from traceview.parsers.record import read_run_record
from traceview.views import text

ALL_REDUCE, BROADCAST, SEND = W.op_index("all_reduce"), W.op_index("broadcast"), W.op_index("send")
KIB16 = 16 * 1024


class Job:
    """``ranks`` records under RUN/raw; ``step`` plays one step on every rank: ``calls`` per
    rank (op, bytes), each collective begun on every rank, then ended on every rank that is
    not ``waiting`` (those are left inside it, as a rank blocked in a collective)."""

    def __init__(self, tmp: Path, ranks: int) -> None:
        self.raw = tmp / "raw"
        self.records = [W.StepRecord(self.raw / f"rank-{r:05d}") for r in range(ranks)]
        self.groups = [rec.group("0") for rec in self.records]

    def step(self, calls: list[list[tuple[int, int]]], end_step: bool = True) -> None:
        for r, rec in enumerate(self.records):
            rec.restore(rec.phase(W.IO_PHASE))  # (its batch)
            for op, nbytes in calls[r]:
                rec.call_end(rec.call_begin(op, self.groups[r], nbytes, p2p=op == SEND), 0)
            if end_step:
                rec.step_end()

    def steady(self, n: int, ranks: int | None = None) -> None:
        for _ in range(n):
            self.step([[(ALL_REDUCE, KIB16)] * 3 for _ in self.records])

    def wait_in(self, rank: int, op: int = ALL_REDUCE, nbytes: int = KIB16) -> None:
        """``rank`` begins a collective that never returns."""
        self.records[rank].call_begin(op, self.groups[rank], nbytes)

    def end(self, rank: int, state: str | None, detail: str | None = None, later_s: float = 0.0):
        """How ``rank`` ended, ``later_s`` after its last progress (None: it never did)."""
        rec = self.records[rank]
        if state is None:
            return
        t = rec.progress + int(later_s * 1e9)
        end = {"state": state, "detail": detail, "t_ns": t, "step": rec.step, "pid": rec.pid}
        (rec.folder / "end.json").write_text(json.dumps(end))

    def stack(
        self,
        rank: int,
        frames: list[tuple[str, int, str, str]],
        reason: str = "signal",
        t_ns: int | None = None,
    ):
        threads = [{"thread": "MainThread", "main": True, "frames": [
            {"file": f, "line": n, "function": fn, "code": c} for f, n, fn, c in frames
        ]}]  # fmt: skip
        (self.records[rank].folder / "stacks.json").write_text(
            json.dumps({"reason": reason, "threads": threads, "t_ns": t_ns})
        )

    def failure(self, job_failed: bool = True):
        record = read_run_record(self.raw)
        assert record is not None
        assert not record.warnings, record.warnings
        return analyse_failure(record.steps, record.calls, record.ranks, job_failed=job_failed)


TIMEOUT = "RuntimeError: [gloo/unbound_buffer.cc:78] Timed out waiting 6000ms for recv operation"


def test_a_clean_run_has_no_failure(tmp_path: Path) -> None:
    job = Job(tmp_path, 3)
    job.steady(5)
    for r in range(3):
        job.end(r, "ok")
    found = job.failure(job_failed=False)
    assert found.failure is None
    assert [(a.state, a.last_step, a.last_seq) for a in found.ranks_at_end] == [
        ("finished", 5, 15)
    ] * 3


def test_a_rank_stuck_in_data_loading_is_the_hang_not_the_ranks_that_timed_out(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, 3)
    job.steady(8)
    stuck = job.records[1]
    stuck.phase(W.IO_PHASE)  # step 8: its batch never comes
    for r in (0, 2):
        job.records[r].restore(job.records[r].phase(W.IO_PHASE))
        job.wait_in(r)
        job.end(r, "exception", TIMEOUT, later_s=6.0)
    job.stack(1, [("/job/train.py", 30, "main", "x = next(it)"),
                  ("/venv/site-packages/torch/utils/data/dataloader.py", 725, "__next__", ""),
                  ("/job/train.py", 12, "batch", "time.sleep(60)")])  # fmt: skip
    job.end(1, "signal", "terminated (SIGTERM)", later_s=7.0)
    found = job.failure()
    f = found.failure
    assert f is not None
    assert (f.kind, f.rank, f.step, f.phase, f.op, f.seq, f.group) == (
        "hang",
        1,
        8,
        "io",
        "all_reduce",
        25,
        "0",
    )
    assert f.waiting == [0, 2]
    assert (
        "rank 1 was stuck 7.0 s in data loading (train.py:12 in batch: time.sleep(60))" in f.detail
    )
    assert (
        "ranks 0 and 2 waited for it in all_reduce #1 of that step (call 25 of group 0)" in f.detail
    )
    assert "until the 6 s timeout" in f.detail
    states = {a.rank: (a.state, a.in_) for a in found.ranks_at_end}
    assert states == {
        0: ("blocked", "all_reduce #25 (group 0)"),
        1: ("stuck", "data loading"),
        2: ("blocked", "all_reduce #25 (group 0)"),
    }


def test_a_skipped_call_of_equal_shape_is_a_desync_at_the_step_it_happened(tmp_path: Path) -> None:
    """Rank 1 leaves out one all-reduce at step 4; gloo pairs the rest silently, so rank 1 runs
    a call ahead until the others wait for a call it never makes: a desync, at step 4, not a
    hang at the end."""
    job = Job(tmp_path, 3)
    job.steady(4)
    three, two = [(ALL_REDUCE, KIB16)] * 3, [(ALL_REDUCE, KIB16)] * 2
    job.step([three, two, three])
    job.steady(3)
    for r in (0, 2):
        job.wait_in(r)
        job.end(r, "exception", TIMEOUT, later_s=6.0)
    job.end(1, "ok")  # (it ended its loop a call early, and left)
    f = job.failure().failure
    assert f is not None and (f.kind, f.rank, f.step) == ("desync", 1, 4), f
    assert "left out one of its equal all_reduce calls #1-#3 of the step" in f.detail
    assert "1 collective ahead" in f.detail


def test_of_two_ranks_the_one_that_left_its_own_count_desynchronized(tmp_path: Path) -> None:
    job = Job(tmp_path, 2)
    job.steady(3)
    job.step([[(ALL_REDUCE, KIB16)] * 3, [(ALL_REDUCE, KIB16)] * 4])  # (rank 1: one more)
    job.steady(2)
    job.end(0, "exception", TIMEOUT, later_s=6.0)
    job.end(1, "exception", TIMEOUT, later_s=6.0)
    f = job.failure().failure
    assert f is not None and (f.kind, f.rank, f.step) == ("desync", 1, 3), f
    assert (
        "made an extra all_reduce among its equal calls #1-#4 of the step" in f.detail
        and "behind" in f.detail
    )


def test_a_skipped_call_of_another_size_is_a_desync_named_at_its_call(tmp_path: Path) -> None:
    """Sizes 8, 8 and 16 KiB: rank 1 leaves out the second and calls the 16 KiB one in its
    place; the call content parts at call 2 of step 3."""
    job = Job(tmp_path, 3)
    sizes = [(ALL_REDUCE, 8192), (ALL_REDUCE, 8192 * 2), (ALL_REDUCE, KIB16 * 4)]
    for _ in range(3):
        job.step([sizes] * 3)
    job.step([sizes[:1], [sizes[0], sizes[2]], sizes[:1]], end_step=False)
    for r in (0, 2):
        job.wait_in(r, ALL_REDUCE, sizes[1][1])
    found = job.failure()
    f = found.failure
    assert f is not None and (f.kind, f.rank, f.step, f.seq) == ("desync", 1, 3, 11), f
    assert (
        "left out all_reduce (16 KiB) and called the next collective all_reduce (64 KiB)"
        in f.detail
    )


def test_another_op_at_the_same_sequence_number_is_a_mismatch(tmp_path: Path) -> None:
    job = Job(tmp_path, 3)
    job.steady(2)
    ok = [(ALL_REDUCE, KIB16)] * 3
    job.step([ok, [(ALL_REDUCE, KIB16), (BROADCAST, KIB16), (ALL_REDUCE, KIB16)], ok])
    f = job.failure().failure
    assert f is not None and (f.kind, f.rank, f.step, f.seq, f.op) == (
        "mismatch",
        1,
        2,
        8,
        "broadcast",
    )
    assert (
        "rank 1 called broadcast (16 KiB) where the others called all_reduce (16 KiB)" in f.detail
    )


@pytest.mark.parametrize("how", ["raised", "killed"])
def test_a_rank_that_dies_is_the_crash_and_the_others_waited(tmp_path: Path, how: str) -> None:
    job = Job(tmp_path, 3)
    job.steady(6)
    for r in (0, 2):
        job.wait_in(r)
        job.end(r, "exception", "RuntimeError: Connection closed by peer [127.0.0.1]:4000", 1.0)
    if how == "raised":
        job.end(1, "exception", "ValueError: bad batch")
    f = job.failure().failure
    assert f is not None and (f.kind, f.rank, f.step, f.op, f.seq) == (
        "crash",
        1,
        6,
        "all_reduce",
        19,
    )
    assert f.waiting == [0, 2]
    words = "raised at step 6: ValueError: bad batch" if how == "raised" else "was killed at step 6"
    assert words in f.detail, f.detail


def _rank_0_dies_rank_1_waits(job: Job) -> None:
    """Step 6: rank 0 dies after its batch (no end, no call); rank 1 waits in the step's first
    all-reduce until its connection to rank 0 is reset."""
    for r in (0, 1):
        job.records[r].restore(job.records[r].phase(W.IO_PHASE))
    job.wait_in(1)
    job.end(1, "exception", "RuntimeError: Connection reset by peer [127.0.0.1]:4000", 1.0)


def test_a_rank_killed_by_its_launcher_after_another_died_is_not_taken_for_the_first(
    tmp_path: Path,
) -> None:
    """DDP's calls are made from C++: a rank killed by itself after its forward and a slower rank
    the launcher killed while it still computed its step both leave no end and no call open.
    The slower one's last progress is older, but its stacks, taken at the launcher's SIGTERM,
    say it was alive after the other died: the first to die is the crash."""
    job = Job(tmp_path, 3)
    job.steady(6)
    slow, first = job.records[2], job.records[0]
    slow.phase(W.IO_PHASE)  # (step 6 begun on the slow rank, its last progress)
    _rank_0_dies_rank_1_waits(job)
    job.stack(2, [("/job/train.py", 40, "main", "loss.backward()")], "signal",
              t_ns=first.progress + 2_000_000_000)  # fmt: skip
    f = job.failure().failure
    assert f is not None and (f.kind, f.rank, f.step, f.op) == ("crash", 0, 6, "all_reduce"), f
    assert f.waiting == [1]


def test_a_rank_killed_inside_the_call_the_others_wait_in_waited_too(tmp_path: Path) -> None:
    """The launcher killed a rank inside the call the dead rank never made, after the call had
    failed (gloo's Flight Recorder then says it ended) and before its end was written: it
    waited for the dead rank as the others did, and is not taken for it."""
    job = Job(tmp_path, 3)
    job.steady(6)
    killed = job.records[2]
    killed.restore(killed.phase(W.IO_PHASE))
    _rank_0_dies_rank_1_waits(job)
    killed.call_end(killed.call_begin(ALL_REDUCE, job.groups[2], KIB16), 0)  # (failed: ended)
    f = job.failure().failure
    assert f is not None
    assert (f.kind, f.rank, f.step, f.op, f.seq, f.waiting) == (
        "crash",
        0,
        6,
        "all_reduce",
        19,
        [1, 2],
    )


def test_steps_every_rank_changes_together_and_stages_that_differ_are_no_desync(
    tmp_path: Path,
) -> None:
    """A pipeline's stages make different numbers of calls each step, and an evaluation step
    adds calls on every rank: neither is a desync. The job then dies of a crash on rank 2."""
    job = Job(tmp_path, 3)
    ar = (ALL_REDUCE, KIB16)
    stage = [[ar, (SEND, 4096)], [ar, (SEND, 4096), (SEND, 4096)], [ar]]
    for i in range(6):
        job.step([c + [ar] * 2 if i == 3 else c for c in stage])
    for r in (0, 1):
        job.wait_in(r)
        job.end(r, "exception", TIMEOUT, later_s=6.0)
    f = job.failure().failure
    assert f is not None and (f.kind, f.rank) == ("crash", 2), f


# --- the record as untrusted input ---------------------------------------------------------------


def test_a_record_cut_short_keeps_its_whole_rows(tmp_path: Path) -> None:
    job = Job(tmp_path, 2)
    job.steady(4)
    steps = job.raw / "rank-00001" / "steps.bin"
    written = len(W.MAGIC_STEPS) + 4 * W.STEP_ROW.size  # (the file grows in zeroed chunks)
    steps.write_bytes(steps.read_bytes()[: written - 7])  # (the last row cut)
    record = read_run_record(job.raw)
    assert record is not None
    per_rank = record.steps.group_by("rank").aggregate([("step", "count")]).to_pylist()
    assert sorted((r["rank"], r["step_count"]) for r in per_rank) == [(0, 4), (1, 3)]


@pytest.mark.parametrize(
    "damage",
    ["garbage steps", "garbage calls", "huge header", "backwards steps", "bad json", "empty"],
)
def test_a_damaged_record_is_set_aside_with_a_warning_never_raised(
    tmp_path: Path, damage: str
) -> None:
    job = Job(tmp_path, 2)
    job.steady(3)
    folder = job.raw / "rank-00001"
    if damage == "garbage steps":
        (folder / "steps.bin").write_bytes(b"\x00\xff" * 100)
    elif damage == "garbage calls":
        (folder / "calls.bin").write_bytes(b"not a record at all")
    elif damage == "huge header":
        data = bytearray((folder / "calls.bin").read_bytes())
        struct.pack_into("<I", data, 8, 0xFFFFFFFF)  # (capacity)
        (folder / "calls.bin").write_bytes(bytes(data))
    elif damage == "backwards steps":
        rows = W.STEP_ROW.pack(9, 1, 10, 20, 0, 0) + W.STEP_ROW.pack(2, 1, 30, 40, 0, 0)
        (folder / "steps.bin").write_bytes(W.MAGIC_STEPS + rows)
    elif damage == "bad json":
        for name in ("end.json", "stacks.json", "groups.json", "fr.json"):
            (folder / name).write_text('{"threads": [1, {"main": true, "frames": 5}], "state": ')
    elif damage == "empty":
        (folder / "steps.bin").write_bytes(b"")
        (folder / "calls.bin").write_bytes(b"")
    record = read_run_record(job.raw)
    assert record is not None
    if damage != "bad json":
        assert record.warnings and all(w.startswith("rank 1:") for w in record.warnings), (
            record.warnings
        )
    found = analyse_failure(record.steps, record.calls, record.ranks, job_failed=True)
    assert len(found.ranks_at_end) == 2


def test_hostile_names_in_a_stack_stay_text(tmp_path: Path) -> None:
    job = Job(tmp_path, 2)
    job.steady(2)
    job.records[1].phase(W.IO_PHASE)
    job.wait_in(0)
    job.end(0, "exception", TIMEOUT, later_s=6.0)
    job.stack(1, [("/job/\x1b[31mevil[/red].py", 1, "[bold]f\x07", "\x1b]0;title\x07")])
    job.end(1, "signal", "terminated (SIGTERM)", later_s=7.0)
    found = job.failure()
    f = found.failure
    assert f is not None and f.kind == "hang"
    assert f.stack[-1].function == "[bold]f\x07"  # (kept as written; views escape it)
    console = Console(record=True, width=200, color_system=None)
    text._failure(
        SimpleNamespace(failure=f, ranks_at_end=found.ranks_at_end, ranks=[]), console, False
    )
    shown = console.export_text()
    assert "\x1b" not in shown and "\x07" not in shown
    assert "[bold]f" in shown  # (markup shown as text, not applied)


# --- the TUI's drawing of how a failed job ended ------------------------------------------------


def _tail(rank: int, steps: list[tuple[int, int, int]], end_ms: int) -> RankTail:
    from traceview.model.results import StepSpan

    ms = 1_000_000
    return RankTail(
        rank=rank,
        steps=[StepSpan(step=n, start_ns=a * ms, end_ns=b * ms) for n, a, b in steps],
        end_ns=end_ms * ms,
    )


def test_the_ending_draws_each_ranks_last_steps_then_its_state() -> None:
    """Two ranks step together for 40 ms; rank 1 then sits stuck for 8 s while rank 0 waits
    in a collective from 2 s on; rank 2 is killed 1 s after its last step."""
    from traceview.model.results import Failure, RankAtEnd
    from traceview.tui.ending import ending_text

    tails = [
        _tail(0, [(4, 0, 10), (5, 10, 20), (6, 20, 30), (7, 30, 40)], 8040),
        _tail(1, [(4, 0, 10), (5, 10, 20), (6, 20, 30), (7, 30, 40)], 8040),
        _tail(2, [(4, 0, 10), (5, 10, 20)], 1020),
    ]
    at_end = [
        RankAtEnd(rank=0, last_step=8, last_seq=25, state="blocked", in_="all_reduce #25", since_s=6.0),
        RankAtEnd(rank=1, last_step=8, last_seq=24, state="stuck", in_="data loading", since_s=8.0),
        RankAtEnd(rank=2, last_step=6, last_seq=18, state="killed"),
    ]  # fmt: skip
    failure = Failure(kind="hang", rank=1, step=8, detail="", waiting=[0])
    lines = ending_text(tails, at_end, failure, width=120).plain.splitlines()
    rows = {int(line.split()[1]): line for line in lines if line.startswith("rank ")}
    assert sorted(rows) == [0, 1, 2]
    bar = {r: line[20 : 120 - 44] for r, line in rows.items()}
    cut = bar[0].index("┆")
    assert all(b.index("┆") == cut for b in bar.values())
    # left of the cut: steps 4-7 fill ranks 0 and 1 to the cut, rank 2 only its half
    assert set(bar[0][:cut]) <= {"█", "▓"} and set(bar[1][:cut]) <= {"█", "▓"}
    assert bar[2][: cut // 2 - 1].strip("█▓") == "" and bar[2][cut // 2 + 2 : cut].strip() == ""
    # right of it: rank 1 stuck to the end, rank 0 blocked to the end, rank 2's ✗ early
    assert set(bar[1][cut + 1 :].rstrip()) == {"!"} and len(bar[1][cut + 1 :].rstrip()) > 20
    assert set(bar[0][cut + 1 :].rstrip()) == {"░"}
    killed = bar[2][cut + 1 :].rstrip()
    assert killed.endswith("✗") and len(killed) < len(bar[1][cut + 1 :].rstrip()) / 4
    assert rows[1].endswith("stuck in data loading 8.0 s") and "4-7" in rows[1]
    assert "blocked in all_reduce #25 6.0 s" in rows[0]


def test_the_ending_shows_the_failing_rank_among_many() -> None:
    from traceview.model.results import Failure, RankAtEnd
    from traceview.tui.ending import SHOWN_RANKS, ending_text

    tails = [_tail(r, [(0, 0, 10)], 20) for r in range(1024)]
    at_end = [RankAtEnd(rank=r, last_step=0, last_seq=1, state="blocked") for r in range(1024)]
    failure = Failure(kind="hang", rank=700, step=0, detail="", waiting=[3])
    text = ending_text(tails, at_end, failure, width=100).plain
    shown = [int(line.split()[1]) for line in text.splitlines() if line.startswith("rank ")]
    assert len(shown) == SHOWN_RANKS and 700 in shown and 3 in shown
    assert f"… and {1024 - SHOWN_RANKS} more ranks" in text


def test_a_rank_that_raises_in_its_data_loading_crashed_there(tmp_path: Path) -> None:
    """Rank 1's batch of step 3 raises: the exception leaves the data-loading phase as it
    unwinds, but the rank's end says where it raised, so the crash is in `io`, not "its step"
    (a caught StopIteration, an epoch's end, is no such place)."""
    job = Job(tmp_path, 3)
    job.steady(3)
    rec = job.records[1]
    left = rec.phase(W.IO_PHASE)
    rec.raised_in(W.IO_PHASE)  # (what the phase mark does as the exception passes)
    rec.restore(left)
    rec.end("exception", "RuntimeError: a corrupt shard")
    for r in (0, 2):
        job.wait_in(r)
        job.end(r, "exception", TIMEOUT, later_s=6.0)
    f = job.failure().failure
    assert f is not None and (f.kind, f.rank, f.step, f.phase) == ("crash", 1, 3, "io"), f
    # an exception of an earlier step, caught by the job, says nothing of where it died
    other = Job(tmp_path / "other", 2)
    other.records[1].raised_in(W.IO_PHASE)
    other.steady(2)
    other.records[1].end("exception", "RuntimeError: later, in its step")
    other.wait_in(0)
    other.end(0, "exception", TIMEOUT, later_s=6.0)
    assert other.failure().failure.phase != "io"


def test_calls_of_a_group_no_file_names_are_matched_as_one_group(tmp_path: Path) -> None:
    """A record without its groups.json (a rank killed before it wrote it, or removed): its
    calls' group is unknown on every rank, and still one group (polars once warned on each
    comparison with None, and matched nothing)."""
    import warnings

    job = Job(tmp_path, 3)
    job.steady(4)
    job.wait_in(0)
    job.wait_in(2)
    for path in tmp_path.glob("raw/*/groups.json"):
        path.unlink()
    record = read_run_record(tmp_path / "raw")
    assert record is not None and set(record.calls.column("group").to_pylist()) == {None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = analyse_failure(record.steps, record.calls, record.ranks, job_failed=True)
    f = result.failure
    assert f is not None and (f.rank, f.waiting) == (1, [0, 2]), f
