"""Issue 49's ground truth: jobs that hang, desynchronize or die on purpose (3 ranks, gloo, a 6 s
timeout, under `traceview collect`; tests/workloads/failures/faulty.py), each fault on a known
rank at a known step and call (the job writes what it injected to truth/fault.json). The report
must name the right kind, rank, step and call, not the rank the launcher blames (the first to
time out), and read the run with exit code 0.

Each step of the job makes three all-reduces (calls 3K+1..3K+3 of the default group at step K:
the group's sequence numbers start at 1), so the call a fault hits is known from the step.
Run times on the shared 2-core machine: 12-20 s a job (the hangs wait for the 6 s timeout).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli
from tests.live.test_parallel_jobs import _launcher

pytestmark = [pytest.mark.torch]

SCRIPT = REPO / "tests" / "workloads" / "failures" / "faulty.py"
CALLS_PER_STEP = 3

#: name: the job's arguments (the fault, its rank and step)
JOBS: dict[str, list[str]] = {
    "hang-io": ["--fault", "hang-io", "--rank", "1", "--step", "8"],
    "hang-checkpoint": ["--fault", "hang-checkpoint", "--rank", "2", "--step", "9"],
    "hang-loop": ["--fault", "hang-loop", "--rank", "0", "--step", "3"],
    "skip": ["--fault", "skip", "--rank", "2", "--step", "6"],
    "skip-differ": ["--fault", "skip", "--shapes", "differ", "--rank", "1", "--step", "8"],
    "other-op": ["--fault", "other-op", "--rank", "1", "--step", "10"],
    "raise": ["--fault", "raise", "--rank", "2", "--step", "4"],
    "kill": ["--fault", "kill", "--rank", "1", "--step", "9"],
    "none": ["--fault", "none"],
    "hang-io-ddp": ["--fault", "hang-io", "--ddp", "--rank", "2", "--step", "7"],
    "kill-ddp": ["--fault", "kill", "--ddp", "--rank", "0", "--step", "6"],
    "kill-early": ["--fault", "kill", "--rank", "1", "--step", "1"],
}


class FaultyJob:
    def __init__(self, out: Path) -> None:
        self.out, self.run = out, out / "run"
        self.truth = json.loads((out / "truth" / "fault.json").read_text())
        self._report: dict[str, Any] | None = None

    def report(self) -> dict[str, Any]:
        if self._report is None:
            result = run_cli("report", self.run, "--json")
            assert result.code == 0, result.err
            self._report = json.loads(result.out)
        return self._report


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    made: dict[str, FaultyJob] = {}

    def job(name: str) -> FaultyJob:
        if name not in made:
            out = tmp_path_factory.mktemp(name)
            cmd = [
                "collect", "-o", out / "run", "--stall", "3", "--no-report", "--", *_launcher(),
                "--nproc-per-node", "3", SCRIPT, "--truth", out / "truth", *JOBS[name],
            ]  # fmt: skip
            result = run_cli(*cmd)
            failed = name != "none"
            assert (result.code != 0) == failed, result.err[-3000:]
            made[name] = FaultyJob(out)
        return made[name]

    return job


def _others(job: FaultyJob) -> list[int]:
    return [r for r in range(job.truth["world"]) if r != job.truth["rank"]]


@pytest.mark.parametrize("name", ["hang-io", "hang-checkpoint", "hang-loop"])
def test_a_stuck_rank_is_the_hang_and_the_others_waited_for_it(jobs: Any, name: str) -> None:
    """The rank that stopped outside a collective is named, at the step it stopped in, with
    where it stood (data loading: the `io` phase; a checkpoint; a loop: its own frame); the
    others waited in the call it never made, the first of their next step or this one."""
    job = jobs(name)
    report = job.report()
    f = report["failure"]
    truth = job.truth
    assert f is not None, report["ranks_at_end"]
    assert (f["kind"], f["rank"], f["step"]) == ("hang", truth["rank"], truth["step"]), f
    assert f["op"] == "all_reduce" and f["group"] is not None
    assert sorted(f["waiting"]) == _others(job)
    functions = [frame["function"] for frame in f["stack"]]
    if name == "hang-io":
        # (the batch of the step: before its all-reduces, the step's first call)
        assert f["phase"] == "io" and "__getitem__" in functions
        assert f["seq"] == CALLS_PER_STEP * truth["step"] + 1
        assert "in data loading" in f["detail"]
    elif name == "hang-checkpoint":
        # (after the step's all-reduces: the others wait in the next step's first)
        assert "save_checkpoint" in functions and "a checkpoint (torch.save)" in f["detail"]
        assert f["seq"] == CALLS_PER_STEP * (truth["step"] + 1) + 1
    else:
        assert "spin" in functions and f["seq"] == CALLS_PER_STEP * (truth["step"] + 1) + 1
    assert "until the 6 s timeout" in f["detail"], f["detail"]
    ends = {r["rank"]: r for r in report["ranks_at_end"]}
    assert ends[truth["rank"]]["state"] == "stuck"
    assert all(ends[r]["state"] == "blocked" for r in _others(job)), ends


@pytest.mark.parametrize("name", ["skip", "skip-differ"])
def test_a_skipped_collective_is_a_desync_at_the_step_it_was_skipped(jobs: Any, name: str) -> None:
    """Equal shapes: gloo pairs the wrong calls silently and the job hangs at its end; the
    desync is named at the step where the sequences part. Another size: the call after the
    skipped one stands in its place."""
    job = jobs(name)
    f = job.report()["failure"]
    truth = job.truth
    assert f is not None
    assert (f["kind"], f["rank"], f["step"]) == ("desync", truth["rank"], truth["step"]), f
    if name == "skip-differ":  # (call 2 of the step, whose place call 3 took)
        assert f["seq"] == CALLS_PER_STEP * truth["step"] + 2
        assert "left out all_reduce" in f["detail"]


def test_another_op_at_the_same_call_is_a_mismatch(jobs: Any) -> None:
    job = jobs("other-op")
    f = job.report()["failure"]
    truth = job.truth
    assert f is not None
    assert (f["kind"], f["rank"], f["step"], f["op"]) == (
        "mismatch", truth["rank"], truth["step"], "broadcast"
    ), f  # fmt: skip
    assert f["seq"] == CALLS_PER_STEP * truth["step"] + 2


@pytest.mark.parametrize("name", ["raise", "kill"])
def test_a_rank_that_dies_is_the_crash(jobs: Any, name: str) -> None:
    """A rank that raises (inside the profiled window: its trace is written) or is killed
    with SIGKILL (its exit handlers never run) is the crash; the others waited for it in the
    step's first all-reduce."""
    job = jobs(name)
    report = job.report()
    f = report["failure"]
    truth = job.truth
    assert f is not None
    assert (f["kind"], f["rank"], f["step"]) == ("crash", truth["rank"], truth["step"]), f
    assert f["seq"] == CALLS_PER_STEP * truth["step"] + 1
    words = "injected failure" if name == "raise" else "was killed"
    assert words in f["detail"]
    ends = {r["rank"]: r for r in report["ranks_at_end"]}
    assert ends[truth["rank"]]["state"] == ("crashed" if name == "raise" else "killed")
    # the others waited in that call; one still computing its step when the launcher ended the
    # job (a loaded machine) never reached it, and is not said to have waited
    assert f["waiting"] and set(f["waiting"]) <= set(_others(job))
    for rank in set(_others(job)) - set(f["waiting"]):
        assert ends[rank]["state"] != "blocked" and ends[rank]["last_seq"] < f["seq"], ends[rank]


@pytest.mark.parametrize("name", ["hang-io-ddp", "kill-ddp"])
def test_ddp_calls_made_from_cpp_are_read_from_the_flight_recorder(jobs: Any, name: str) -> None:
    """DistributedDataParallel's all-reduces are made by its reducer in C++, past traceview's
    wrapper: the Flight Recorder's dump (each rank writes it as it ends) holds them, and the
    others are seen waiting in one."""
    job = jobs(name)
    report = job.report()
    f = report["failure"]
    truth = job.truth
    kind = "hang" if name.startswith("hang") else "crash"
    assert f is not None
    undumped = [
        r for r in _others(job) if not (job.run / "raw" / f"rank-{r:05d}" / "fr.json").is_file()
    ]
    if kind == "crash" and undumped:
        # the launcher killed a waiting rank before its watchdog's stall dump (seen once in a
        # full suite on 2 loaded cores): two ranks killed in one step, none seen in a call, and
        # their ends a heartbeat apart; the first by the record may be either. Known limit.
        ends = {r["rank"]: r["state"] for r in report["ranks_at_end"]}
        assert (f["kind"], f["step"]) == (kind, truth["step"]), f
        assert ends[truth["rank"]] == "killed" and f["rank"] in [truth["rank"], *undumped], f
        return
    if kind == "crash" and not f["waiting"]:
        # the launcher ended the job before another rank reached the killed rank's call (seen
        # in a full suite on 2 loaded cores): nobody waited, so no call is named, and no rank
        # is said to have been blocked
        ends = {r["rank"]: r for r in report["ranks_at_end"]}
        assert (f["kind"], f["rank"], f["step"], f["op"]) == (
            kind,
            truth["rank"],
            truth["step"],
            None,
        )
        assert all(ends[r]["state"] != "blocked" for r in _others(job)), ends
        return
    assert (f["kind"], f["rank"], f["step"], f["op"]) == (
        kind, truth["rank"], truth["step"], "all_reduce"
    ), f  # fmt: skip
    ends = {r["rank"]: r for r in report["ranks_at_end"]}
    if kind == "hang":
        assert sorted(f["waiting"]) == _others(job)
        assert all(ends[r]["state"] == "blocked" for r in _others(job)), ends
        return
    # a killed rank: the others waited for it in that call; one still computing its step when
    # the launcher ended the job (seen once in CI on 2 loaded cores: its stacks and Flight
    # Recorder dumped at SIGTERM, then killed before its end was written) never reached the
    # call, is not said to have waited, and is not taken for the rank that died first
    assert f["waiting"] and set(f["waiting"]) <= set(_others(job))
    for rank in set(_others(job)) - set(f["waiting"]):
        assert ends[rank]["state"] != "blocked", ends[rank]
        assert ends[rank]["last_seq"] is None or ends[rank]["last_seq"] < f["seq"], ends[rank]


def test_a_job_that_dies_before_its_profiled_window_is_reported_from_its_record(jobs: Any) -> None:
    """Killed at step 1 (the window starts at step 2): no rank wrote a trace, and the report is
    the step record's account: the crash named, exit code 0, no profiled figures."""
    job = jobs("kill-early")
    report = job.report()
    f = report["failure"]
    assert f is not None and (f["kind"], f["rank"], f["step"]) == ("crash", 1, 1), f
    assert report["run"]["ranks"] == 0 and report["per_step"] == []
    text = run_cli("report", job.run)
    assert text.code == 0, text.err
    first = next(line for line in text.out.splitlines() if line.startswith("crash: "))
    assert first.startswith("crash: rank 1 was killed at step 1"), text.out
    assert "Per step" not in text.out  # (no profiled window to break down)
    assert "what follows is its step record's account only" in text.out.replace("\n", " ")


def test_a_clean_run_has_no_failure_and_every_rank_finished(jobs: Any) -> None:
    report = jobs("none").report()
    assert report["failure"] is None
    assert [r["state"] for r in report["ranks_at_end"]] == ["finished"] * 3
    assert {r["last_step"] for r in report["ranks_at_end"]} == {14}  # (--steps 14: 0..13 ended)


def test_the_text_report_opens_with_the_failure(jobs: Any) -> None:
    job = jobs("hang-io")
    text = run_cli("report", job.run)
    assert text.code == 0, text.err
    lines = text.out.splitlines()
    first_failure = next(i for i, line in enumerate(lines) if line.startswith("hang: "))
    verdict = next(i for i, line in enumerate(lines) if "is the bottleneck" in line)
    assert first_failure < verdict, text.out[:1500]
    assert "Where each rank was when the job ended" in text.out


def test_the_timeline_draws_how_each_rank_ended(jobs: Any) -> None:
    """The TUI's view of a hang: each rank's last steps from its record (the job's numbers,
    up to the step before the one it stopped in), the stuck rank drawn stuck to its end."""
    from traceview.runs import open_run
    from traceview.tui.ending import ending_text
    from traceview.tui.model import build_view

    job = jobs("hang-io")
    with open_run([job.run]) as run:
        view = build_view(run)
    stuck = job.truth["rank"]
    tails = {t.rank: t for t in view.tails}
    assert sorted(tails) == list(range(job.truth["world"]))
    assert tails[stuck].steps[-1].step == job.truth["step"] - 1
    text = ending_text(view.tails, view.report.ranks_at_end, view.report.failure, 120).plain
    row = next(line for line in text.splitlines() if line.startswith(f"rank {stuck} "))
    assert "!" in row and "stuck in data loading" in row


def test_export_carries_the_step_record_of_the_whole_run(jobs: Any, tmp_path: Path) -> None:
    """Every step each rank ended, profiled or not, as Parquet: the stuck rank's last is the
    step before the one it stopped in; each step's three all-reduces are calls 3K+1..3K+3."""
    import polars as pl

    job = jobs("hang-io")
    done = run_cli("export", job.run, "--format", "parquet", "-o", tmp_path / "out")
    assert done.code == 0, done.err
    steps = pl.read_parquet(tmp_path / "out" / "record_steps.parquet")
    calls = pl.read_parquet(tmp_path / "out" / "record_calls.parquet")
    ranks = pl.read_parquet(tmp_path / "out" / "record_ranks.parquet")
    stuck, step = job.truth["rank"], job.truth["step"]
    last = dict(steps.group_by("rank").agg(pl.col("step").max()).iter_rows())
    assert last[stuck] == step - 1
    assert all(last[r] >= step - 1 for r in _others(job))
    assert steps.filter(pl.col("rank") == stuck)["step"].to_list() == list(range(step))
    own = calls.filter((pl.col("source") == "record") & (pl.col("step") < step))
    per_step = own.group_by("rank", "step").agg(pl.col("seq").sort())
    for rank_, n, seqs in per_step.iter_rows():
        assert seqs == [CALLS_PER_STEP * n + i for i in (1, 2, 3)], (rank_, n, seqs)
    assert sorted(ranks["rank"].to_list()) == list(range(job.truth["world"]))
