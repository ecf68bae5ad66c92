"""The live tier's part of ``tests/unit/test_collect_tensorflow.py``: what these check, and why, is
said at the top of that file (real jobs here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO, Result, job_death, run_cli

WORKLOADS = REPO / "tests" / "workloads"
pytestmark = pytest.mark.mpi


def _needs_tensorflow() -> None:
    pytest.importorskip("tensorflow", reason="pip install tensorflow-cpu==2.21.0")
    pytest.importorskip("xprof", reason="pip install '.[tensorflow]'")


def _mpirun(n: int = 2) -> list[str]:
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (pip install -e '.[mpi]' provides Open MPI)")
    flags = ["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else ["--oversubscribe"]
    return [mpirun, *flags, "-np", str(n)]


# What glibc prints when TensorFlow's profiler has corrupted the heap.
HEAP_CORRUPTION = (
    "double free or corruption",
    "free(): ",
    "corrupted ",
    "malloc(): ",
    "malloc_consolidate(): ",
    "munmap_chunk(): ",
    "Segmentation fault",
)
ATTEMPTS = 3
JOB_TIMEOUT_S = 180  # these jobs take 10-20 s


def _stuck_in_profiler_stop(run: Path) -> bool:
    return any(
        json.loads(path.read_text()).get("state") == "stopping"
        for path in (run / "raw").glob("rank-*/status.json")
    )


def collect_tensorflow(run: Path, *args: str | Path) -> Result:
    """``traceview collect -o RUN ARGS...``, run again when TensorFlow's profiler broke the job
    (see the module docstring); any other failure is returned as it is."""
    command = [sys.executable, "-m", "traceview", "collect", "-o", str(run), *map(str, args)]
    for attempt in range(1, ATTEMPTS + 1):
        shutil.rmtree(run, ignore_errors=True)
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env={**os.environ, "COLUMNS": "120"},
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            if not _stuck_in_profiler_stop(run):
                pytest.fail(f"collect hung for {JOB_TIMEOUT_S} s, not in tf.profiler:\n{err}")
            what = "a worker hung in tf.profiler.experimental.stop()"
        else:
            result = Result(proc.returncode, out, err)
            # a worker that lost its peer's gRPC connection (job_death) is run again too
            crash = next((text for text in HEAP_CORRUPTION if text in err), None)
            crash = crash or job_death(result)
            if proc.returncode == 0 or crash is None:
                return result
            what = f"a worker aborted: {crash.strip()}"
        warnings.warn(f"attempt {attempt}: the job broke ({what})", stacklevel=2)
    pytest.fail(f"the job broke {ATTEMPTS} times in a row (the last: {what}):\n{err[-3000:]}")


def test_multi_worker_custom_loop_under_mpirun(tmp_path: Path) -> None:
    _needs_tensorflow()
    run = tmp_path / "run"
    result = collect_tensorflow(
        run, "--steps", "3", "--warmup", "1", "--skip", "2", "--",
        *_mpirun(), sys.executable, WORKLOADS / "tf_train.py", "--steps", "10", "--port", "23671",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "tensorflow · 2 ranks · 3 steps" in result.out
    collect = json.loads((run / "manifest.json").read_text())["collect"]
    assert [r["rank"] for r in collect["ranks"]] == [0, 1]
    for rank in collect["ranks"]:
        assert rank["state"] == "ok" and rank["framework"] == "tensorflow"
    for folder in ("rank-00000", "rank-00001"):
        status = json.loads((run / "raw" / folder / "status.json").read_text())
        assert status["profiled_steps"] == 3 and len(status["trace_files"]) == 1
        assert (run / "raw" / folder / status["trace_files"][0]).is_file()
        assert not (run / "raw" / folder / ".tfprofile").exists()
    report = run_cli("report", run, "--json").json()
    summary = report["summary"]
    # the strategy all-reduces every step's gradients after backward
    assert summary["comm_total_ms"] > 0 and summary["breakdown_ms"]["comm"] > 0
    assert summary["breakdown_ms"]["backward"] > 0 and summary["breakdown_ms"]["forward"] > 0
    assert {op["op"] for op in report["top_ops"]} >= {"fully_connected", "allreduce"}
    # the resident memory collect samples at each step boundary (TensorFlow itself records only
    # what oneDNN's "mklcpu" allocator handles on CPU, where it records anything)
    for rank in report["ranks"]:
        status = json.loads((run / "raw" / f"rank-{rank['rank']:05d}" / "status.json").read_text())
        assert len(status["rss_samples"]) >= 3
        rss = rank["memory"]["by_device"]["rss"]
        assert rss["peak_mb"] == round(max(b for _, b in status["rss_samples"]) / 2**20, 3)


def test_keras_fit_steps_come_from_its_batches(tmp_path: Path) -> None:
    _needs_tensorflow()
    run = tmp_path / "run"
    result = collect_tensorflow(
        run, "--steps", "4", "--warmup", "1", "--skip", "2", "--",
        sys.executable, WORKLOADS / "tf_train.py", "--loop", "fit", "--steps", "10",
    )  # fmt: skip
    assert result.code == 0, result.err
    report = run_cli("report", run, "--json").json()
    assert report["run"]["framework"] == "tensorflow" and report["run"]["steps"] == 4
    breakdown = report["summary"]["breakdown_ms"]
    assert breakdown["forward"] > 0 and breakdown["backward"] > 0


def test_workers_configured_by_tf_config_alone(tmp_path: Path) -> None:
    """A cluster manager's launch: each worker knows its place only from TF_CONFIG."""
    _needs_tensorflow()
    run = tmp_path / "run"
    result = collect_tensorflow(
        run, "--steps", "2", "--warmup", "1", "--skip", "2", "--",
        sys.executable, WORKLOADS / "tf_config_launcher.py", "2", "--steps", "8",
    )  # fmt: skip
    assert result.code == 0, result.err
    for rank in (0, 1):
        status = json.loads((run / "raw" / f"rank-{rank:05d}" / "status.json").read_text())
        assert status["rank_source"] == "TF_CONFIG" and status["world_size"] == 2
    report = run_cli("report", run, "--json").json()
    assert report["run"]["ranks"] == 2 and report["summary"]["comm_total_ms"] > 0


def test_a_profile_past_the_memory_cap_stops_and_keeps_the_steps_before_it(tmp_path: Path) -> None:
    """3,000 eager ops a step (~3 MiB of profile here): past a 20 MiB cap the main thread is
    interrupted inside a step, tf.profiler stops there and its XSpace is kept; that step is
    left out, the steps before it are reported, and the job runs on unprofiled."""
    _needs_tensorflow()
    run = tmp_path / "run"
    result = collect_tensorflow(
        run, "--skip", "0", "--warmup", "1", "--steps", "100", "--max-profile-memory", "20M", "--",
        sys.executable, WORKLOADS / "tf_grow.py", "--steps", "20", "--ops", "3000",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "step 19:" in result.out and "done" in result.out
    status = json.loads((run / "raw" / "rank-00000" / "status.json").read_text())
    stop = status["stop_step"]
    assert status["stop_reason"] == "memory cap 20 MiB reached" and 2 <= stop < 20
    assert (
        status["trace_files"] and (run / "raw" / "rank-00000" / status["trace_files"][0]).is_file()
    )
    line = f"rank 0: profile stopped at step {stop}: memory cap 20 MiB reached"
    assert f"warning: {line}" in result.out
    report = run_cli("report", run, "--json").json()
    kept = [s["step"] for s in report["per_step"]]
    if status["stop_mid_step"]:  # interrupted inside the step: it is cut short and left out
        assert status["profiled_steps"] == stop - 1 and kept == list(range(1, stop))
        assert [s["step"] for s in report["incomplete_steps"]] == [stop]
    else:  # stopped at the boundary after it: it is complete
        assert status["profiled_steps"] == stop and kept == list(range(1, stop + 1))


def test_past_steps_the_profile_has_stopped(tmp_path: Path) -> None:
    """--steps 2 of a job that goes on for 4 more batches and 4 s of eager work: nothing after
    the second recorded step is in the trace."""
    _needs_tensorflow()
    from tests.live.test_collect import recorded_after_the_last_step_s

    run = tmp_path / "run"
    result = collect_tensorflow(
        run, "--skip", "0", "--warmup", "0", "--steps", "2", "--",
        sys.executable, WORKLOADS / "tf_grow.py", "--steps", "6", "--ops", "200", "--tail", "4",
    )  # fmt: skip
    assert result.code == 0, result.err
    status = json.loads((run / "raw" / "rank-00000" / "status.json").read_text())
    assert status["profiled_steps"] == 2 and not status["stop_reason"]
    assert recorded_after_the_last_step_s(run) < 1.0
