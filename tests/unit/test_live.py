"""Issue 51: the whole run and the live look, from step records written by the rank side's own
writer (collectors/rankside_record.py) on a clock the test sets, so that every step's length,
every wait and the step where a rank slows down are known exactly; profile requests from the
asking side (runs/windows.py) to the rank side (StepRecord, the collectors' lifecycle).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from traceview.analysis.live import LiveInputs, snapshot
from traceview.analysis.whole_run import whole_run
from traceview.collectors import rankside_record as W
from traceview.model.errors import BadInput
from traceview.parsers.record import read_run_record
from traceview.runs.live import LiveRun, ask_profile
from traceview.runs.windows import list_windows

MS = 1_000_000
ALL_REDUCE = W.op_index("all_reduce")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000 * 10**9

    def time_ns(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(W, "time", SimpleNamespace(time_ns=clock.time_ns, sleep=lambda s: None))
    return clock


class Job:
    """A synchronous job of ``ranks`` played step by step on the test's clock: each rank works
    its own time, then all-reduces (waiting for the last rank to arrive, then 1 ms of
    transfer), then its step ends."""

    def __init__(self, run: Path, ranks: int, clock: Clock) -> None:
        self.run, self.clock = run, clock
        self.records = [W.StepRecord(run / "raw" / f"rank-{r:05d}") for r in range(ranks)]
        self.group = [rec.group("0") for rec in self.records]
        self.start = clock.now

    def step(self, own_ms: list[float]) -> None:
        arrive = [self.start + int(ms * MS) for ms in own_ms]
        end = max(arrive) + 1 * MS
        for rec, group, at in zip(self.records, self.group, arrive, strict=True):
            self.clock.now = at
            slot = rec.call_begin(ALL_REDUCE, group, 4096)
            self.clock.now = end
            rec.call_end(slot, 0)
            rec.step_end()
        self.start = end

    def hang(self, stuck: int, own_ms: float) -> None:
        """Every rank but ``stuck`` enters the step's all-reduce; ``stuck`` never arrives."""
        for r, (rec, group) in enumerate(zip(self.records, self.group, strict=True)):
            if r != stuck:
                self.clock.now = self.start + int(own_ms * MS)
                rec.call_begin(ALL_REDUCE, group, 4096)


def _own(rank: int, step: int, slow: int, rng: np.random.Generator) -> float:
    base = 10.0 * rng.uniform(0.97, 1.03)
    return base * 1.3 if rank == slow and step >= 150 else base


def test_whole_run_finds_the_change_the_slowed_rank_and_the_slow_step(
    tmp_path: Path, clock: Clock
) -> None:
    rng = np.random.default_rng(1)
    job = Job(tmp_path, 3, clock)
    for step in range(300):
        own = [_own(r, step, 2, rng) for r in range(3)]
        if step == 77:
            own[0] += 40.0  # (one long step on rank 0: a checkpoint)
        job.step(own)
    record = read_run_record(tmp_path / "raw")
    assert record is not None
    # the time blocked in the all-reduce is in the record: a rank's own work is its step less it
    # (from step 1: the record's first step begins at the rank's first sign, its first call)
    steps = record.steps.to_pydict()
    own = np.array(steps["end_ns"]) - np.array(steps["start_ns"]) - np.array(steps["comm_ns"])
    later = np.array(steps["step"]) > 0
    assert own[later].min() > 9.5 * MS and own[later].max() < 13.5 * MS + 40 * MS
    found = whole_run(record.steps)
    assert found is not None and found.steps == 300
    assert [(c.step, c.rank) for c in found.changes] == [(150, 2)]
    change = found.changes[0]
    assert change.ms_before == pytest.approx(11.3, rel=0.03)  # max of three ~10 ms, + 1 ms
    assert change.ms_after == pytest.approx(14.0, rel=0.03)  # 13 ms + 1 ms
    assert found.slowest_rank == 2
    assert found.own_ms[2] == pytest.approx(0.5 * 10 + 0.5 * 13, rel=0.03)
    assert [(s.step, s.rank) for s in found.slow_steps] == [(77, 0)]
    # a profile window's steps are named as such and left out of the changes
    windowed = whole_run(record.steps, [(1, 74, 76)])
    assert windowed is not None and windowed.slow_steps[0].window == 1


def test_a_balanced_run_has_no_slowest_rank_and_no_change(tmp_path: Path, clock: Clock) -> None:
    rng = np.random.default_rng(2)
    job = Job(tmp_path, 4, clock)
    for _ in range(200):
        job.step([10.0 * rng.uniform(0.95, 1.05) for _ in range(4)])
    record = read_run_record(tmp_path / "raw")
    assert record is not None
    found = whole_run(record.steps)
    assert found is not None
    assert found.slowest_rank is None and found.changes == [] and found.slow_steps == []


def _live_json(run: Path, **more: object) -> None:
    said = {"collect_pid": os.getpid(), "host": socket.gethostname(), "started": "2026-12-03",
            "stall_s": 5.0, "steps": 3, "warmup": 1, **more}  # fmt: skip
    (run / "live.json").write_text(json.dumps(said))


def test_a_look_reads_only_what_was_added_and_waits_for_a_row_cut_short(
    tmp_path: Path, clock: Clock
) -> None:
    job = Job(tmp_path, 2, clock)
    _live_json(tmp_path)
    for _ in range(100):
        job.step([10.0, 12.0])
    live = LiveRun(tmp_path)
    first = snapshot(live.look(clock.now))
    assert first.job.state == "running" and first.job.steps == 100
    assert [r.step for r in first.ranks] == [100, 100]
    assert first.step_ms.last == pytest.approx(13.0) and first.step_ms.over_steps == 100
    assert first.slowest_rank == 1
    offsets = [live.ranks[r].offset for r in (0, 1)]
    for _ in range(50):
        job.step([10.0, 12.0])
    # a row cut short (seen mid-write, as a reader on another host may): read once it is whole
    steps0 = tmp_path / "raw" / "rank-00000" / "steps.bin"
    row = W.STEP_ROW.pack(150, 1, clock.now, clock.now + 13 * MS, 0, 3 * MS)
    at = len(W.MAGIC_STEPS) + 150 * W.STEP_ROW.size
    with open(steps0, "r+b") as f:
        f.seek(at)
        f.write(row[:17])
    second = snapshot(live.look(clock.now))
    assert [r.step for r in second.ranks] == [150, 150]
    assert live.ranks[0].offset == offsets[0] + 50 * W.STEP_ROW.size
    assert live.ranks[1].offset == offsets[1] + 50 * W.STEP_ROW.size
    with open(steps0, "r+b") as f:
        f.seek(at + 17)
        f.write(row[17:])
    third = LiveRun(tmp_path).look(clock.now)
    assert third.ranks[0].steps_done == 151
    # replaced (a rank started again): read from its start
    steps0.write_bytes(W.MAGIC_STEPS + W.STEP_ROW.pack(0, 0, clock.now, clock.now + MS, 0, 0))
    again = live.look(clock.now)
    assert len(live.ranks[0].rows) == 1 and again.ranks[0].steps_done >= 1


def test_a_hang_shows_the_stuck_rank_and_the_waiting_ones_past_the_threshold(
    tmp_path: Path, clock: Clock
) -> None:
    job = Job(tmp_path, 3, clock)
    _live_json(tmp_path)
    for _ in range(40):
        job.step([10.0, 10.0, 10.0])
    job.hang(stuck=1, own_ms=10.0)
    live = LiveRun(tmp_path)
    clock.now += 3 * 10**9  # (under the 5 s threshold: still running)
    early = snapshot(live.look(clock.now))
    assert [r.state for r in early.ranks] == ["running"] * 3 and not early.alerts
    clock.now += 3 * 10**9
    late = snapshot(live.look(clock.now))
    states = {r.rank: (r.state, r.in_) for r in late.ranks}
    assert states == {
        0: ("blocked", "all_reduce #41"),
        1: ("stuck", "its step"),
        2: ("blocked", "all_reduce #41"),
    }
    texts = [a.text for a in late.alerts if a.kind == "stopped"]
    assert texts[0].startswith("rank 1 stopped finishing steps at step 40: stuck")
    assert texts[1].startswith("ranks 0, 2 blocked in all_reduce #41")
    # the contract of watch --once --json
    said = json.loads(late.to_json())
    assert set(said["job"]) >= {"state", "started", "steps"}
    assert set(said["step_ms"]) >= {"last", "p50", "p99"}
    assert "slowest_rank" in said
    for rank in said["ranks"]:
        assert set(rank) >= {"rank", "step", "step_ms", "lag_steps", "state"}
        assert isinstance(rank["step"], int) and isinstance(rank["lag_steps"], int)
    assert isinstance(said["job"]["steps"], int)


def test_lag_is_steps_behind_the_rank_furthest_on(tmp_path: Path, clock: Clock) -> None:
    job = Job(tmp_path, 2, clock)
    _live_json(tmp_path)
    for _ in range(20):
        job.step([10.0, 10.0])
    for _ in range(3):  # (rank 0 runs ahead: an asynchronous job)
        clock.now += 10 * MS
        job.records[0].step_end()
    look = snapshot(LiveRun(tmp_path).look(clock.now))
    assert {r.rank: r.lag_steps for r in look.ranks} == {0: 0, 1: 3}
    assert look.job.steps == 20


def test_a_profile_request_reaches_the_ranks_at_its_step(tmp_path: Path, clock: Clock) -> None:
    job = Job(tmp_path, 2, clock)
    _live_json(tmp_path)
    for _ in range(30):
        job.step([10.0, 10.0])
    window, start, ranks = ask_profile(tmp_path, steps=3, warmup=1)
    assert (window, ranks) == (1, 2)
    # every rank reads it before its steps begin: 1.5 s of 11 ms steps ahead, and the warm-up
    assert start >= 30 + 1500 // 11
    asked = json.loads((tmp_path / "requests" / "profile-1.json").read_text())
    assert asked == {**asked, "window": 1, "start_step": start, "steps": 3, "warmup": 1}
    rec = job.records[0]
    rec._look_for_requests()
    assert rec.asked == [{"window": 1, "start_step": start, "steps": 3, "warmup": 1}]
    # a request that does not read or is out of range is left alone
    (tmp_path / "requests" / "profile-2.json").write_text('{"window": 2, "start_step": -1}')
    (tmp_path / "requests" / "profile-3.json").write_text("\x1b[2J not json")
    os.utime(tmp_path / "requests", ns=(1, 1))
    rec._look_for_requests()
    assert [a["window"] for a in rec.asked] == [1]
    windows = list_windows(tmp_path, ranks=2)
    assert [(w.window, w.state, w.first_step) for w in windows] == [(1, "asked", start)]


def test_the_collector_takes_a_window_at_its_step_and_drops_one_passed(
    tmp_path: Path, clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    from traceview.collectors.rankside import Config
    from traceview.collectors.rankside_lifecycle import Collector

    class Plain(Collector):
        framework = "pytorch"

        def _hook(self) -> None: ...
        def manual_step(self) -> None: ...
        def phase(self, name: str):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        def _framework_version(self) -> str:
            return "0"

        def _stop_for_memory(self) -> None: ...
        def _end_profile(self, at_exit: bool) -> None: ...

    collector = Plain(Config(run_dir=tmp_path, warmup=2, active=5))
    record = W.StepRecord(tmp_path / "raw" / "rank-00000")
    collector._step_record = record
    for _ in range(10):
        record.step_end()
    record.asked = [
        {"window": 1, "start_step": 5, "steps": 2, "warmup": 1},  # (passed: steps 5-6)
        {"window": 2, "start_step": 14, "steps": 3, "warmup": 2},
    ]
    assert collector.window_asked() is None  # (window 1 dropped; window 2 from step 12 on)
    assert [a["window"] for a in record.asked] == [2]
    # a flood of asks whose steps have passed: all dropped, said in one line
    record.asked = [
        {"window": k, "start_step": 2, "steps": 2, "warmup": 0} for k in range(3, 1003)
    ] + record.asked
    assert collector.window_asked() is None and [a["window"] for a in record.asked] == [2]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2, said
    assert said[-1] == (
        "traceview: 1000 profile windows (3 to 1002) not taken: their steps had passed (step 10 "
        "now) when this rank read it"
    )
    record.step_end()
    record.step_end()
    asked = collector.window_asked()
    assert asked is not None and asked["window"] == 2
    with collector.lock:
        began = collector.open_window(asked)
    assert (began, collector.window_warmup, collector.window_active) == (12, 2, 3)
    assert collector.window_dir() == tmp_path / "windows" / "2"


def test_asking_an_ended_job_or_a_folder_collect_did_not_make_is_refused(
    tmp_path: Path, clock: Clock
) -> None:
    with pytest.raises(BadInput, match="not a run traceview collect"):
        ask_profile(tmp_path, 3, None)
    job = Job(tmp_path, 1, clock)
    job.step([10.0])
    _live_json(tmp_path, exit_code=0)
    with pytest.raises(BadInput, match="the job has ended"):
        ask_profile(tmp_path, 3, None)


def test_a_flood_of_requests_is_refused_past_the_pending_ones(tmp_path: Path, clock: Clock) -> None:
    job = Job(tmp_path, 1, clock)
    job.step([10.0])
    _live_json(tmp_path)
    asked = [ask_profile(tmp_path, 2, 0)[0] for _ in range(4)]
    assert asked == [1, 2, 3, 4]
    firsts = [w.first_step for w in list_windows(tmp_path, ranks=1)]
    assert firsts == sorted(firsts) and len(set(firsts)) == 4  # (one after the other)
    with pytest.raises(BadInput, match="4 profile windows asked and not yet written"):
        ask_profile(tmp_path, 2, 0)


def test_inputs_of_no_rank_make_an_empty_look() -> None:
    from traceview.analysis.live import JobSaid

    look = snapshot(
        LiveInputs(
            job=JobSaid(None, None, None, False, None, 20.0),
            ranks=[],
            steps=np.empty(0, np.int64),
            step_ms=np.empty(0),
            step_rank=np.empty(0, np.int64),
            rows={},
            now_ns=0,
        )
    )
    assert look.job.state == "running" and look.ranks == [] and look.step_ms.p50 is None


# --- hostile records, live.json and requests (issue 55) ----------------------------------------


def _steps(folder: Path, rows: list[tuple[int, int, int, int, int, int]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "steps.bin").write_bytes(W.MAGIC_STEPS + b"".join(W.STEP_ROW.pack(*r) for r in rows))


def test_step_numbers_far_apart_make_no_row_for_each_number_between(tmp_path: Path) -> None:
    """Steps 0 and 2**32 - 1 (a hostile record: a look once allocated 32 GB for the numbers
    between); a row repeated counts once."""
    t = 1_700_000_000 * 10**9
    rows = [(0, 1, t, t + 10 * MS, 0, 0), (2**32 - 1, 1, t + 20 * MS, t + 32 * MS, 0, 0)]
    _steps(tmp_path / "raw" / "rank-00000", rows)
    _steps(tmp_path / "raw" / "rank-00001", [rows[0], rows[0], rows[1]])
    _live_json(tmp_path)
    look = LiveRun(tmp_path).look()
    assert look.steps.tolist() == [0, 2**32 - 1]
    assert look.step_ms.tolist() == [10.0, 12.0]


def test_what_live_json_says_is_bounded_and_escaped(tmp_path: Path, clock: Clock) -> None:
    Job(tmp_path, 1, clock).step([10.0])
    _live_json(tmp_path, collect_pid=2**70, started="\u202eevil\x1b[2J", exit_code=None)
    job = LiveRun(tmp_path).look().job
    assert job.collect_alive is None  # (no such process id: not asked of the system)
    assert job.started is not None and "\u202e" not in job.started and "\x1b" not in job.started
    (tmp_path / "raw" / "rank-00000" / "end.json").write_text(
        json.dumps({"state": "signal", "detail": "x", "t_ns": 2**70})
    )
    record = read_run_record(tmp_path / "raw")
    assert record is not None and record.ranks.column("end_ns").to_pylist() == [None]


def test_a_job_whose_every_rank_has_ended_is_not_asked(tmp_path: Path, clock: Clock) -> None:
    job = Job(tmp_path, 2, clock)
    job.step([10.0, 10.0])
    _live_json(tmp_path)
    for rec in job.records:
        (rec.folder / "end.json").write_text(json.dumps({"state": "ok", "t_ns": clock.now}))
    with pytest.raises(BadInput, match="every rank of the job has ended"):
        ask_profile(tmp_path, 2, 0)
    assert not (tmp_path / "requests").exists()


def test_asks_at_once_from_threads_of_one_process_each_get_a_window(tmp_path: Path) -> None:
    """Four threads of one process claiming the same window at once, twenty-five times: each
    gets a window of its own (their temporary files were one name a process and window: one
    thread's clean-up removed another's file before it was linked, and that ask was lost)."""
    import threading

    from traceview.runs.windows import _claim

    def claim(folder: Path, barrier: threading.Barrier, claimed: list[int]) -> None:
        barrier.wait()
        claimed.append(_claim(folder, {"window": 1, "start_step": 5}))

    for round_ in range(25):
        folder = tmp_path / f"requests-{round_}"
        folder.mkdir()
        barrier, claimed = threading.Barrier(4), []
        threads = [
            threading.Thread(target=claim, args=(folder, barrier, claimed)) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(claimed) == [1, 2, 3, 4]
        assert sorted(p.name for p in folder.iterdir()) == [
            f"profile-{k}.json" for k in (1, 2, 3, 4)
        ]


def test_a_request_is_never_written_over_nor_outside_the_run(tmp_path: Path, clock: Clock) -> None:
    import threading

    run = tmp_path / "run"
    Job(run, 1, clock).step([10.0])
    _live_json(run)
    (run / "requests").mkdir()
    (run / "requests" / "profile-1.json").write_bytes(b"junk")  # (unreadable: no window)
    assert ask_profile(run, 2, 0)[0] == 2
    assert (run / "requests" / "profile-1.json").read_bytes() == b"junk"
    # two asks at once get two windows, neither lost
    barrier, asked = threading.Barrier(2), []

    def ask() -> None:
        barrier.wait()
        asked.append(ask_profile(run, 2, 0)[0])

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(asked) == [3, 4]
    assert sorted(p.name for p in (run / "requests").iterdir()) == [
        f"profile-{k}.json" for k in (1, 2, 3, 4)
    ]
    # a requests folder that links elsewhere is refused, nothing written there
    outside = tmp_path / "outside"
    outside.mkdir()
    for p in (run / "requests").iterdir():
        p.unlink()
    (run / "requests").rmdir()
    (run / "requests").symlink_to(outside, target_is_directory=True)
    with pytest.raises(BadInput, match="a link, not a folder of the run"):
        ask_profile(run, 2, 0)
    assert list(outside.iterdir()) == []


def test_a_record_longer_than_read_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceview.parsers import record as reader

    t = 1_700_000_000 * 10**9
    _steps(tmp_path / "raw" / "rank-00000", [(s, 1, t + s, t + s + 1, 0, 0) for s in range(30)])
    monkeypatch.setattr(reader, "JSON_LIMIT", len(W.MAGIC_STEPS) + 10 * W.STEP_ROW.size)
    record = read_run_record(tmp_path / "raw")
    assert record is not None and record.steps.num_rows == 10
    assert any("first 10 steps read, the rest left out" in w for w in record.warnings)
