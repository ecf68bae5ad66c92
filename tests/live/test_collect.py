"""The live tier's part of ``tests/unit/test_collect.py``: what these check, and why, is
said at the top of that file (real jobs here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, run_cli, run_job
from traceview.collectors import rankside
from traceview.collectors.launch import pass_environment

WORKLOADS = REPO / "tests" / "workloads"
pytestmark = pytest.mark.mpi


def _needs_torch() -> None:
    pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU build)")


def _mpirun() -> list[str]:
    _needs_torch()
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (pip install -e '.[mpi]' provides Open MPI)")
    flags = ["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else ["--oversubscribe"]
    return [mpirun, *flags, "-np", "2"]


#: With --skip 0 the profiler starts with the job's step 1 (it sees step 0 end first); steps
#: carry the job's own numbers.
FIRST = 1


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_ddp_job_under_mpirun(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [
        "collect", "-o", run, "--steps", "4", "--warmup", "1", "--skip", "1", "--",
        *_mpirun(), sys.executable, WORKLOADS / "ddp_train.py", "--steps", "12", "--port", "29661",
    ]  # fmt: skip
    result = run_job(lambda: run_cli(*cmd), run)
    assert result.code == 0, result.err
    assert "Per rank" in result.out and "communication: total" in result.out
    collect = _manifest(run)["collect"]
    assert collect["exit_code"] == 0 and collect["world_size"] == 2
    launched = collect["launched"]
    assert launched[1:3] == ["-x", "PYTHONPATH"] and "TRACEVIEW_RUN_DIR" in launched
    ranks = collect["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:
        assert (
            rank["state"] == "ok" and rank["trace"] and rank["rank_source"] == "torch.distributed"
        )
        clock = rank["clock"]
        # one machine, one clock: the measured offset must be (near) zero, within its error
        assert clock["method"] == "tcp"
        assert abs(clock["offset_ns"]) <= clock["uncertainty_ns"] + 100_000
        assert clock["uncertainty_ns"] < 5_000_000
    steps = pq.read_table(run / "steps.parquet").to_pylist()
    # steps carry the job's own numbers (its first step is 0): the collector sees step 0 end,
    # lets --skip 1 more pass, starts the profiler with step 2 (the warm-up); 3-6 are recorded
    assert sorted((s["rank"], s["step"]) for s in steps) == [
        (r, s) for r in (0, 1) for s in range(3, 7)
    ]
    report = run_cli("report", run, "--json").json()
    assert report["summary"]["comm_total_ms"] > 0 and report["run"]["ranks"] == 2
    # memory is recorded by default: every rank has its CPU allocator's figures
    assert report["summary"]["memory"] is not None
    for rank in report["ranks"]:
        memory = rank["memory"]
        assert memory["device"] == "cpu" and memory["peak_mb"] > 0, memory
        assert memory["reserved_peak_mb"] is None  # the CPU allocator keeps no reserve
        # the process's resident memory, sampled at each step boundary while profiling
        status = json.loads((run / "raw" / f"rank-{rank['rank']:05d}" / "status.json").read_text())
        samples = status["rss_samples"]
        assert len(samples) >= 4 + 1
        rss = memory["by_device"]["rss"]
        assert rss["peak_mb"] == round(max(b for _, b in samples) / 2**20, 3)
        assert rss["peak_mb"] > memory["peak_mb"]  # the whole process, not what it allocated


def test_no_memory_leaves_memory_records_out(tmp_path: Path) -> None:
    _needs_torch()
    run = tmp_path / "run"
    result = run_cli(
        "collect", "--no-memory", "-o", run, "--steps", "2", "--warmup", "0", "--skip", "1",
        "--no-report", "--", sys.executable, WORKLOADS / "ddp_train.py", "--steps", "5",
        "--port", "29667",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert pq.read_table(run / "memory.parquet").num_rows == 0
    status = json.loads((run / "raw" / "rank-00000" / "status.json").read_text())
    assert status["rss_samples"] == []
    report = run_cli("report", run, "--json").json()
    assert report["summary"]["memory"] is None and report["ranks"][0]["memory"] is None


MPICH_MPIEXEC = Path(
    os.environ.get("TRACEVIEW_MPICH_MPIEXEC", REPO / ".venv-mpich" / "bin" / "mpiexec")
)


def test_ddp_job_under_mpich(tmp_path: Path) -> None:
    """MPICH's Hydra launcher (the `mpich` wheel, in its own environment so that its mpiexec
    does not shadow Open MPI's): traceview passes its variables with -genv and takes the ranks
    from PMI_RANK until torch.distributed names them."""
    _needs_torch()
    if not MPICH_MPIEXEC.exists():
        pytest.skip(f"no MPICH at {MPICH_MPIEXEC} (.ci/run makes .venv-mpich: pip install mpich)")
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--steps", "3", "--warmup", "1", "--skip", "1", "--",
        MPICH_MPIEXEC, "-np", "2", sys.executable, WORKLOADS / "ddp_train.py", "--steps", "10",
        "--port", "29671",
    )  # fmt: skip
    assert result.code == 0, result.err
    collect = _manifest(run)["collect"]
    launched = collect["launched"]
    assert launched[1:3] == ["-genv", "PYTHONPATH"] and "-x" not in launched
    assert [(r["rank"], r["state"]) for r in collect["ranks"]] == [(0, "ok"), (1, "ok")]
    report = run_cli("report", run, "--json").json()
    assert report["run"]["ranks"] == 2 and report["run"]["steps"] == 3
    assert report["summary"]["comm_total_ms"] > 0  # DDP's all-reduce ran between the two ranks


def test_a_failing_rank_keeps_the_others_traces(tmp_path: Path) -> None:
    run, meet = tmp_path / "run", tmp_path / "meet"
    meet.mkdir()
    # rank 1 fails once rank 0 is at step 6 too (past its profile): the ranks train apart, and
    # on a loaded machine rank 0 could otherwise still be starting when rank 1 fails
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "1", "--steps", "3", "--",
        *_mpirun(), sys.executable, WORKLOADS / "ddp_train.py",
        "--no-ddp", "--fail-rank", "1", "--fail-at", "6", "--steps", "5000", "--meet", meet,
    )  # fmt: skip
    assert result.code != 0, "the job's failure is collect's exit code"
    states = {r["rank"]: r for r in _manifest(run)["collect"]["ranks"]}
    assert states[1]["state"] == "exception" and "fails on purpose" in states[1]["detail"]
    # rank 0 was still training when Open MPI terminated it: its trace is kept
    assert states[0]["state"] == "signal" and states[0]["trace"]
    report = run_cli("report", run, "--json").json()
    assert 0 in [r["rank"] for r in report["ranks"]]
    assert any("rank 1 ended: exception" in w for w in report["warnings"])


def test_torchrun(tmp_path: Path) -> None:
    _needs_torch()
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun not installed")
    run = tmp_path / "run"
    cmd = [
        "collect", "-o", run, "--steps", "3", "--warmup", "1", "--",
        torchrun, "--standalone", "--nproc-per-node", "2", WORKLOADS / "ddp_train.py", "--steps", "10",
    ]  # fmt: skip
    result = run_job(lambda: run_cli(*cmd), run)
    assert result.code == 0, result.err
    ranks = _manifest(run)["collect"]["ranks"]
    # the two workers, and not torchrun's own agent process (which imports torch too)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["state"] == "ok" and r["trace"] for r in ranks)


def test_script_with_its_own_profiler(tmp_path: Path) -> None:
    _needs_torch()
    run = tmp_path / "run"
    result = run_cli("collect", "-o", run, "--", sys.executable, WORKLOADS / "own_profiler.py")
    assert result.code == 0, result.err
    (rank,) = _manifest(run)["collect"]["ranks"]
    assert rank["user_profiler"] and rank["trace"] and rank["state"] == "ok"
    assert any("its trace is kept" in n for n in rank["notes"])
    assert pq.read_table(run / "steps.parquet").num_rows >= 1


def test_script_without_torch(tmp_path: Path) -> None:
    result = run_cli(
        "collect",
        "-o",
        tmp_path / "run",
        "--",
        sys.executable,
        WORKLOADS / "no_torch.py",
        "--exit-3",
    )
    assert result.code == 3
    assert "sum of squares" in result.out
    assert "left nothing to profile" in result.err


def test_manual_steps_and_phases(tmp_path: Path) -> None:
    _needs_torch()
    run = tmp_path / "run"
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = run_cli(
        "collect",
        "-o",
        run,
        "--skip",
        "1",
        "--warmup",
        "1",
        "--steps",
        "4",
        "--",
        sys.executable,
        WORKLOADS / "manual_steps.py",
        env=env,
    )
    assert result.code == 0, result.err
    assert "active: True" in result.out
    report = run_cli("report", run, "--json").json()
    assert report["run"]["steps"] == 4
    breakdown = report["summary"]["breakdown_ms"]
    for phase in ("io", "forward", "backward", "update"):
        assert breakdown[phase] > 0, phase


def test_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    own = tmp_path / "own-site"
    own.mkdir()
    marker = tmp_path / "marker"
    (own / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = {"PYTHONPATH": str(own)}
    result = run_cli(
        "collect", "-o", tmp_path / "run", "--", sys.executable, WORKLOADS / "no_torch.py", env=env
    )
    assert result.code == 0, result.err
    assert marker.read_text() == "ran"


def test_interrupt_keeps_what_was_recorded(tmp_path: Path) -> None:
    _needs_torch()
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceview", "collect", "-o", str(run), "--skip", "0", "--warmup", "0",
         "--steps", "100000", "--", sys.executable, str(WORKLOADS / "ddp_train.py"), "--steps", "100000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    status = run / "raw" / "rank-00000" / "status.json"
    deadline = time.monotonic() + 120
    while not (status.exists() and '"profiling"' in status.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, (
            "the job never started profiling"
        )
        time.sleep(0.2)
    time.sleep(1.0)
    # The rank's peak memory so far: its 100,000 steps of data are made on demand (a tensor of
    # every sample was 6.5 GB and made this test the suite's peak).
    pid = json.loads(status.read_text())["pid"]
    peak_kb = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert peak_kb < 1_000_000, f"the rank peaked at {peak_kb / 1e6:.1f} GB before Ctrl-C"
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "interrupted (SIGINT)" in err
    assert "Per rank" in out, "the steps recorded before Ctrl-C are reported"
    (rank,) = _manifest(run)["collect"]["ranks"]
    assert rank["trace"]


def test_collect_needs_a_command_and_reports_a_missing_one(tmp_path: Path) -> None:
    result = run_cli("collect", "-o", tmp_path / "a")
    assert result.code == 2 and "give the job's command" in result.err
    result = run_cli("collect", "-o", tmp_path / "b", "--", "no-such-program-traceview")
    assert result.code == 127 and "cannot run no-such-program-traceview" in result.err
    assert "Traceback" not in result.err


def test_environment_is_passed_the_way_each_launcher_wants() -> None:
    env = {"A": "1", "B": "two"}
    assert pass_environment(["mpiexec.hydra", "-n", "2", "python"], env, ["A", "B"]) == [
        "mpiexec.hydra", "-genv", "A", "1", "-genv", "B", "two", "-n", "2", "python",
    ]  # fmt: skip
    for command in (["srun", "-n", "2", "python"], ["torchrun", "x.py"], ["python", "x.py"]):
        assert pass_environment(command, env, ["A"]) == command
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is not None:  # the real Open MPI answers --version as Open MPI does
        assert pass_environment([mpirun, "-np", "2", "python"], env, ["A", "B"])[1:5] == [
            "-x",
            "A",
            "-x",
            "B",
        ]


def test_a_collector_failure_never_breaks_the_job(tmp_path: Path) -> None:
    """The rank side cannot write its results (the run directory is under a file): the job
    still finishes, and the rank says so in one line."""
    _needs_torch()
    from traceview.collectors.launch import write_bootstrap

    bootstrap = write_bootstrap(tmp_path / "run")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = {
        **os.environ,
        "PYTHONPATH": str(bootstrap),
        rankside.ENV_RUN_DIR: str(blocker / "run"),
        rankside.ENV_SKIP: "0",
        rankside.ENV_WARMUP: "0",
        rankside.ENV_STEPS: "2",
    }
    proc = subprocess.run(
        [sys.executable, str(WORKLOADS / "ddp_train.py"), "--steps", "6"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("traceview:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_a_step_a_rank_died_in_is_left_out_of_the_figures(tmp_path: Path) -> None:
    """Rank 1 raises in its 6th step, inside the profile, and rank 0 waits for it in DDP's
    all-reduce until gloo gives up. That step used to count: the report said "comm is the
    bottleneck: 94% of the 84.64 ms step", where the ordinary steps take 5-11 ms. It is left
    out of every figure, listed apart with the wait, and kept, flagged, in the export."""
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "1", "--steps", "8", "--",
        *_mpirun(), sys.executable, WORKLOADS / "ddp_train.py",
        "--fail-rank", "1", "--fail-at", "6", "--steps", "5000",
    )  # fmt: skip
    assert result.code != 0
    report = run_cli("report", run, "--json").json()
    [unfinished] = report["incomplete_steps"]
    assert 1 in unfinished["unfinished_ranks"]
    assert unfinished["waited_rank"] == 0 and unfinished["waited_ms"] > 100
    kept = [s["step"] for s in report["per_step"]]
    assert unfinished["step"] not in kept and report["run"]["steps"] == len(kept) >= 3
    assert report["summary"]["step_ms"] < unfinished["waited_ms"] / 5
    text = run_cli("report", run).out
    assert f"step {unfinished['step']} did not finish on rank" in text
    assert run_cli("export", run, "--format", "parquet", "-o", tmp_path / "out").code == 0
    steps = pl.read_parquet(tmp_path / "out" / "steps.parquet")
    flagged = steps.filter(~pl.col("complete"))
    assert set(flagged["step"].to_list()) == {unfinished["step"]}
    assert steps.filter(pl.col("complete")).height == 2 * len(kept)


def test_a_rank_its_launcher_terminates_while_it_writes_its_trace_still_writes_it(
    tmp_path: Path,
) -> None:
    """Rank 1 raises at its 20th step; gloo fails rank 0's all-reduce, and rank 0 starts writing
    its 18 recorded steps. torchrun's agent sends it SIGTERM meanwhile: the SIGTERM handler ran
    inside that export and ended the process before the trace was renamed into place (rank 0:
    state "signal", no trace, "left nothing to profile" for the whole job). A SIGTERM that
    arrives while the trace is written now waits for it."""
    _needs_torch()
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun not installed")
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "1", "--steps", "30", "--",
        torchrun, "--standalone", "--nproc-per-node", "2", WORKLOADS / "ddp_train.py",
        "--fail-rank", "1", "--fail-at", "20", "--steps", "5000",
    )  # fmt: skip
    assert result.code != 0
    statuses = {r: _status(run, r) for r in (0, 1)}
    assert statuses[1]["state"] == "exception" and statuses[1]["trace_files"]
    assert statuses[0]["state"] in ("exception", "signal"), statuses[0]
    assert statuses[0]["trace_files"] == ["rank-0.pt.trace.json.gz"], statuses[0]
    report = run_cli("report", run, "--json").json()
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["run"]["steps"] >= 10


def test_a_launcher_that_fails_before_any_rank_starts_is_named(tmp_path: Path) -> None:
    """Open MPI run as root without --allow-run-as-root refuses at once. collect used to say "no
    process imported PyTorch ... and ran a training step", which is false: nothing started. It
    now says the launcher failed, with its exit code and what it said, and removes the run
    directory it made, which received nothing."""
    mpirun = [a for a in _mpirun() if a not in ("--allow-run-as-root",)]
    if os.geteuid() != 0:
        pytest.skip("Open MPI refuses only root; run as root to reproduce")
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--", *mpirun, sys.executable, WORKLOADS / "ddp_train.py"
    )
    assert result.code != 0
    lines = [line for line in result.err.splitlines() if line.startswith("traceview:")]
    assert any(
        "the launcher exited with code" in line and "before any rank started" in line
        and "root" in line
        for line in lines
    ), result.err  # fmt: skip
    assert not any("imported PyTorch" in line for line in lines)
    assert not run.exists() and any("removed" in line and "--keep" in line for line in lines)


def test_what_the_launcher_said_last_is_a_line_not_a_rule(tmp_path: Path) -> None:
    """torchrun ends a failure with a summary framed in lines of "=" (Open MPI frames its
    messages in "-"); the line collect quotes used to be that frame: "...left nothing to
    profile: ...: ======". It is now the last line with words in it."""
    script = (
        "import sys\n"
        "print('=' * 54, file=sys.stderr)\n"
        "print('train.py FAILED', file=sys.stderr)\n"
        "print('-' * 54, file=sys.stderr)\n"
        "print('  traceback : Signal 9 (SIGKILL) received by PID 4242', file=sys.stderr)\n"
        "print('=' * 54, file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    result = run_cli("collect", "-o", tmp_path / "run", "--", sys.executable, "-c", script)
    assert result.code == 1
    [line] = [line for line in result.err.splitlines() if "left nothing to profile" in line]
    assert line.endswith("step: traceback : Signal 9 (SIGKILL) received by PID 4242"), line


def test_a_run_directory_that_received_nothing_is_removed_unless_kept(tmp_path: Path) -> None:
    script = [
        sys.executable,
        "-c",
        "import sys; print('x: bad input', file=sys.stderr); sys.exit(3)",
    ]
    result = run_cli("collect", "-o", tmp_path / "a", "--", *script)
    assert result.code == 3 and not (tmp_path / "a").exists()
    said = [line for line in result.err.splitlines() if line.startswith("traceview:")]
    # a Python process did start, it just never imported a framework: say that, and what it said
    assert any("imported PyTorch" in line and line.endswith("x: bad input") for line in said)
    result = run_cli("collect", "--keep", "-o", tmp_path / "b", "--", *script)
    assert result.code == 3 and (tmp_path / "b" / "manifest.json").is_file()
    result = run_cli("collect", "-o", tmp_path / "c", "--", "no-such-program-traceview")
    assert result.code == 127 and not (tmp_path / "c").exists()


def test_a_rank_killed_while_profiling_is_named_with_what_the_job_said_last(tmp_path: Path) -> None:
    """A rank SIGKILLed inside the profile writes no trace; its status still says "profiling".
    collect says so in one line, with the job's exit code and the last line of its stderr (it
    used to leave that line out, which issue 14 asks for)."""
    _needs_torch()
    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal, sys\n"
        "import torch\n"
        "model = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(20):\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "    if i == 5:\n"
        "        print('out of luck at step 5', file=sys.stderr, flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "0", "--steps", "100", "--",
        sys.executable, script,
    )  # fmt: skip
    assert result.code == 128 + signal.SIGKILL, result.err
    assert _status(run)["state"] == "profiling"
    [line] = [line for line in result.err.splitlines() if line.startswith("traceview: the job")]
    assert "exited with code 137" in line and "rank(s) 0 were killed while profiling" in line
    assert line.endswith(": out of luck at step 5"), line


def test_collect_honours_the_umask(tmp_path: Path) -> None:
    """Everything collect and the job's collector write (bootstrap, status, trace, manifest and
    the ingested tables) is 0666/0777 less the umask, as ingest's files are (issue 14: they were
    0600 in 0755 folders, unreadable by others on a shared cluster)."""
    import stat

    _needs_torch()
    job = tmp_path / "train.py"
    job.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(6):\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    run = tmp_path / "run"
    script = (
        f"umask 027 && {sys.executable} -m traceview collect --no-report -o {run} "
        f"--skip 0 --warmup 0 --steps 3 -- {sys.executable} {job}"
    )
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    paths = [run, *run.rglob("*")]
    names = {p.name for p in paths}
    assert {"manifest.json", "status.json", "steps.parquet"} <= names
    assert any(p.name.endswith(".pt.trace.json.gz") for p in paths)
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o750 if path.is_dir() else 0o640), (path, oct(mode))


def test_a_job_started_from_a_background_shell_gets_sigint_back(tmp_path: Path) -> None:
    """A non-interactive shell starts background jobs with SIGINT ignored, and an ignored signal
    stays ignored across exec: the job inherited it, so a Ctrl-C (or SIGINT) forwarded to it did
    nothing and its rank kept profiling without bound. collect's own handlers now go in before
    the job starts, and a caught signal is reset to its default in the job."""
    script = tmp_path / "job.py"
    script.write_text(
        "import signal\n"
        "ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN\n"
        "print('SIGINT', 'ignored' if ignored else 'default')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "traceview", "collect", "--keep", "-o", str(tmp_path / "run"),
         "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # a background job
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SIGINT default" in proc.stdout, proc.stdout


# --- the memory cap (issue 14): a profile that grows past it stops and keeps what it has ------


def _status(run: Path, rank: int = 0) -> dict:
    return json.loads((run / "raw" / f"rank-{rank:05d}" / "status.json").read_text())


def test_a_profile_past_the_memory_cap_stops_and_keeps_the_steps_before_it(tmp_path: Path) -> None:
    """Each step runs 20,000 tiny ops, ~60 MiB of profile. With --steps 100 and nothing else the
    rank would profile all 12 steps (and a job of 100,000 steps without bound); past a 150 MiB
    cap its main thread is interrupted inside the step, the profile stops there and is written,
    that step is left out, and the job runs on unprofiled to its end."""
    _needs_torch()
    run = tmp_path / "run"
    # Stopping costs several times what the profile recorded (+1.3 GiB at step 3 here), and
    # more the later the watch sees the cap (a loaded machine: step 6, past the workload's
    # default 3000 MiB safety net before trace_only): the net is raised to 8000 MiB.
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "1", "--steps", "100",
        "--max-profile-memory", "150M", "--",
        sys.executable, WORKLOADS / "grow.py", "--steps", "12", "--ops", "20000",
        "--abort-above", "8000",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "step 11:" in result.out and "done" in result.out  # the job ran on to its end
    # what stopping took is handed back: the job does not carry it on (it kept +1.8 GiB)
    growth = re.search(r"step 11: [\d.]+ s, rss \+(\d+) MiB", result.out)
    assert growth and int(growth[1]) < 150, result.out
    status = _status(run)
    stop = status["stop_step"]
    assert status["state"] == "ok" and status["stop_reason"] == "memory cap 150 MiB reached"
    assert FIRST + 2 <= stop < 12
    (rank,) = _manifest(run)["collect"]["ranks"]
    assert rank["trace"] and rank["stop_step"] == stop
    line = f"rank 0: profile stopped at step {stop}: memory cap 150 MiB reached"
    assert f"warning: {line}" in result.out
    report = run_cli("report", run, "--json").json()
    assert report["warnings"].count(line) == 1
    kept = [s["step"] for s in report["per_step"]]
    # steps 2 .. stop-1 after the warm-up step 1, and the step it stopped in, if it ended
    if status["stop_mid_step"]:  # interrupted inside the step: cut short, left out
        assert rank["stop_mid_step"] and status["profiled_steps"] == stop - FIRST - 1
        assert kept == list(range(FIRST + 1, stop))
        assert [s["step"] for s in report["incomplete_steps"]] == [stop]
    else:  # the step's optimizer step came first: stopped there, the step is complete
        assert status["profiled_steps"] == stop - FIRST
        assert kept == list(range(FIRST + 1, stop + 1))
        assert report["incomplete_steps"] == []


def test_a_step_that_never_ends_is_stopped_at_the_cap(tmp_path: Path) -> None:
    """After 2 optimizer steps the script runs tiny ops for 20 s without stepping again (an
    evaluation): no hook comes, and the profile used to record all of it (~100 MiB/s here). Past
    the cap the main thread is interrupted and the profile stops within the tail."""
    _needs_torch()
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "0", "--steps", "5",
        "--max-profile-memory", "100M", "--",
        sys.executable, WORKLOADS / "grow.py", "--steps", "2", "--ops", "1000", "--tail", "20",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "done" in result.out
    status = _status(run)
    assert status["stop_reason"] == "memory cap 100 MiB reached"
    assert status["stop_step"] == FIRST + 1 and status["stop_mid_step"]
    assert status["profiled_steps"] == 1
    assert "rank 0: profile stopped at step 2: memory cap 100 MiB reached" in result.out
    steps = pq.read_table(run / "steps.parquet").to_pylist()
    tail = next(s for s in steps if s["step"] == FIRST + 1)
    assert tail["wall_ns"] < 10e9, "the profile went on recording the tail"


def test_a_training_thread_past_the_cap_stops_at_its_next_step(tmp_path: Path) -> None:
    """Training on a thread of its own: torch.profiler can only be stopped on the thread that
    started it, and only the main thread can be interrupted, so the profile stops at the next
    optimizer step; the step that just ended is complete and kept."""
    _needs_torch()
    run = tmp_path / "run"
    # --no-memory: with the allocator's records, stopping this 300 MiB profile of 20,000 tiny ops
    # a step takes more than 3000 MiB (2.6 GiB without them; README). Stopping costs more the
    # later the watch sees the cap (a loaded machine: step 7, not 4, and past 3000 MiB without
    # memory records too), so the workload's safety net is raised to 8000 MiB here.
    result = run_cli(
        "collect", "--no-memory", "-o", run, "--skip", "0", "--warmup", "1", "--steps", "100",
        "--max-profile-memory", "150M", "--",
        sys.executable, WORKLOADS / "grow.py", "--steps", "30", "--ops", "20000", "--thread",
        "--abort-above", "8000",
    )  # fmt: skip
    # 30 steps: the cap (crossed near step 4) is seen by a watch that looks twice a second with
    # steps to spare, however fast the machine runs them (8 steps could all end before it looked)
    assert result.code == 0, result.err
    assert "step 29:" in result.out and "done" in result.out
    status = _status(run)
    stop = status["stop_step"]
    assert status["stop_reason"] == "memory cap 150 MiB reached" and not status["stop_mid_step"]
    assert status["profiled_steps"] == stop - FIRST  # steps 2 .. stop, all complete
    report = run_cli("report", run, "--json").json()
    assert [s["step"] for s in report["per_step"]] == list(range(FIRST + 1, stop + 1))
    assert report["incomplete_steps"] == []
    assert (
        f"rank 0: profile stopped at step {stop}: memory cap 150 MiB reached" in report["warnings"]
    )


def test_max_profile_memory_takes_sizes_and_refuses_others(tmp_path: Path) -> None:
    from traceview.commands.collect import memory_size

    assert memory_size("4G") == memory_size("4GiB") == 4 << 30
    assert memory_size("512m") == 512 << 20 and memory_size("1.5G") == 3 << 29
    assert memory_size("0") == memory_size("none") == memory_size("off") == 0
    assert rankside.size_text(4 << 30) == "4 GiB" and rankside.size_text(150 << 20) == "150 MiB"
    assert memory_size("2G") == rankside.DEFAULT_MAX_MEMORY
    assert "(default 2G; 0 or none: no cap)" in " ".join(run_cli("collect", "--help").out.split())
    result = run_cli("collect", "-o", tmp_path / "run", "--max-profile-memory", "4X", "--", "true")
    assert result.code == 2 and "--max-profile-memory: '4X' is not a size" in result.err
    assert "Traceback" not in result.err and not (tmp_path / "run").exists()


def test_a_training_thread_that_ends_inside_the_profile_still_writes_it(tmp_path: Path) -> None:
    """The loop runs on a thread of its own and ends (2 steps, then 2 s of tiny ops) before
    --steps 5 were recorded: the profile was left open on that thread, and at exit torch
    crashed the job (SIGSEGV, exit code 139: its trace lost, its exit code changed). It is now
    stopped on that thread as it ends, the only thread torch.profiler can be stopped on; past the
    cap, which there is no way to act on before, the status says when it stopped."""
    _needs_torch()
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "0", "--steps", "5",
        "--max-profile-memory", "50M", "--",
        sys.executable, WORKLOADS / "grow.py", "--steps", "2", "--ops", "1000", "--tail", "2",
        "--thread",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "done" in result.out
    status = _status(run)
    assert status["state"] == "ok" and status["trace_files"]
    assert (
        status["stop_reason"] == "memory cap 50 MiB reached, stopped only at the end of its thread"
    )
    assert status["stop_step"] == FIRST + 1 and status["stop_mid_step"]
    (rank,) = _manifest(run)["collect"]["ranks"]
    assert rank["trace"]


def recorded_after_the_last_step_s(run: Path) -> float:
    """Seconds of events the rank's trace holds after its last step window ended."""
    events = pq.read_table(
        run / "events" / "rank=0" / "part-0.parquet", columns=["ts_ns", "dur_ns"]
    )
    last = max(t + d for t, d in zip(*events.to_pydict().values(), strict=True))
    steps = pq.read_table(run / "steps.parquet").to_pylist()
    return (last - max(s["end_ns"] for s in steps)) / 1e9


def test_past_steps_the_profile_has_stopped(tmp_path: Path) -> None:
    """--steps 2 of a job that goes on for 4 more steps and 4 s of work: nothing after the
    second recorded step is in the trace."""
    _needs_torch()
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "0", "--steps", "2", "--",
        sys.executable, WORKLOADS / "grow.py", "--steps", "6", "--ops", "1000", "--tail", "4",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert _status(run)["profiled_steps"] == 2 and not _status(run)["stop_reason"]
    assert recorded_after_the_last_step_s(run) < 1.0
