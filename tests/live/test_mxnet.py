"""The live tier's part of ``tests/unit/test_mxnet.py``: what these check, and why, is
said at the top of that file (real jobs here)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, analysed, run_cli
from tests.unit.test_mxnet import (
    BULK,
    MX_SAMPLES,
    check_against_timers,
    check_bulk_segments,
    steps_with_timers,
)
from traceview.model import schema as S
from traceview.store import rundir as R

MX_PYTHON = Path(os.environ.get("TRACEVIEW_MXNET_PYTHON", REPO / ".venv-mxnet" / "bin" / "python"))


# --- live runs: real MXNet processes, real ps-lite -----------------------------------------------


def _mxnet_python() -> Path:
    if not MX_PYTHON.exists():
        pytest.skip(
            f"no MXNet environment at {MX_PYTHON} (tests/workloads/mxnet/make_venv.sh makes it; "
            "TRACEVIEW_MXNET_PYTHON points elsewhere)"
        )
    probe = subprocess.run([str(MX_PYTHON), "-c", "import mxnet"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{MX_PYTHON} cannot import mxnet: {probe.stderr.decode()[-300:]}")
    return MX_PYTHON


LIVE = ("dist_sync", "local", "local_bulk")  # parameter-server, local; local with bulk execution


@pytest.fixture(scope="module", params=LIVE)
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    python = _mxnet_python()
    scenario = request.param
    work = tmp_path_factory.mktemp(f"mxnet-live-{scenario}")
    out, run = work / "out", work / "run"
    launcher = [
        str(Path(sys.executable).with_name("traceview-dmlc"))
        if Path(sys.executable).with_name("traceview-dmlc").exists()
        else shutil.which("traceview-dmlc") or "traceview-dmlc",
        "-n", "2", "-s", "1",
    ] if scenario == "dist_sync" else []  # fmt: skip
    command = [
        sys.executable, "-m", "traceview", "collect", "--no-report", "-o", str(run), "--",
        *launcher, str(python), str(MX_SAMPLES / "make_traces.py"), "train", scenario, str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    merged = subprocess.run(
        [str(python), str(MX_SAMPLES / "make_traces.py"), "merge", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert merged.returncode == 0, merged.stderr
    return scenario, out, run


def test_live_run_matches_its_timers(live: tuple[str, Path, Path]) -> None:
    scenario, out, run = live
    # The tests share the two cores with the job: per step, allow 1 ms or 15 %.
    check_against_timers(steps_with_timers(run, out), f"live {scenario}", 0.15, 1.0)
    if scenario in BULK:
        check_bulk_segments(run, f"live {scenario}")


def test_live_bulk_run_is_left_as_the_job_has_it(live: tuple[str, Path, Path]) -> None:
    """collect leaves MXNet's bulk execution alone (it used to turn it off), and marks the data
    iterator's batches even where the script calls ``it.next()`` (local_bulk does)."""
    scenario, out, run = live
    if scenario not in BULK:
        pytest.skip("bulk execution scenarios only")
    truth = json.loads((out / "groundtruth.json").read_text())
    assert truth["bulk_exec_train"] == "unset (MXNet default: 1)"
    events = pl.from_arrow(R.read_events(run))
    assert isinstance(events, pl.DataFrame)
    names = events[S.NAME].cast(pl.String)
    assert (names == "ImperativeBulk").sum() > 0
    batches = events.filter(names == "DataIter.next")
    assert batches.height >= 5 and set(batches[S.PHASE].cast(pl.String)) == {S.IO}


def test_live_run_manifest(live: tuple[str, Path, Path]) -> None:
    scenario, _, run = live
    manifest = json.loads((run / R.MANIFEST).read_text())  # the file, as a script reads it
    collected = manifest["collect"]
    ranks = collected["ranks"]
    assert all(r["framework"] == "mxnet" and r["trace"] and r["state"] == "ok" for r in ranks)
    # memory by default: MXNet's storage counters, and the process's resident memory at each
    # recorded step boundary (status.json), per worker
    report = run_cli("report", run, "--json").json()
    for rank in report["ranks"]:
        devices = rank["memory"]["by_device"]
        # local trains on two CPU contexts: cpu and cpu:1, the main one the higher
        assert devices["cpu"]["peak_mb"] > 0 and rank["memory"]["device"].startswith("cpu")
        status = json.loads((run / "raw" / f"rank-{rank['rank']:05d}" / "status.json").read_text())
        assert len(status["rss_samples"]) >= 5
        assert devices["rss"]["peak_mb"] == round(
            max(b for _, b in status["rss_samples"]) / 2**20, 3
        )
    if scenario == "dist_sync":
        assert sorted(r["rank"] for r in ranks) == [0, 1]
        assert {r["rank_source"] for r in ranks} == {"kvstore"}
        roles = sorted(p["role"] for p in collected["processes"])
        assert roles == ["scheduler", "server"]
        assert all(p["state"] == "ok" for p in collected["processes"])
        assert any("parameter-server job" in r for r in manifest["notes"]["remarks"])
        summary = run_cli("report", run, "--json").json()["summary"]
        assert summary["comm_total_ms"] > 0 and summary["breakdown_ms"][S.UPDATE] == 0
    else:
        assert [r["rank"] for r in ranks] == [0] and collected["processes"] == []


def test_script_that_marks_its_own_steps_and_phases(tmp_path: Path) -> None:
    """No gluon.Trainer: the script updates its weights with nd.sgd_update and marks steps and
    phases through traceview.collectors (installed in the MXNet environment by make_venv.sh)."""
    python = _mxnet_python()
    probe = subprocess.run(
        [str(python), "-c", "import traceview.collectors"], capture_output=True, timeout=120
    )
    if probe.returncode != 0:
        pytest.skip(f"traceview is not installed in {python} (tests/workloads/mxnet/make_venv.sh)")
    out, run = tmp_path / "out", tmp_path / "run"
    result = run_cli(
        "collect", "--no-report", "-o", run, "--",
        python, REPO / "tests" / "workloads" / "mxnet" / "manual_steps.py", out,
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.code == 0, result.err
    truth = json.loads((out / "groundtruth.json").read_text())
    assert truth["active"], "traceview.collectors saw no collector in the job"
    df = steps_with_timers(run, out)
    assert df[S.STEP].to_list() == [2, 3, 4, 5, 6]  # the user's steps, numbered as collect's
    check_against_timers(df, "manual steps", 0.15, 1.0)
    ops = analysed(run).ops.to_pylist()
    assert {o["op"] for o in ops if o["phase"] == S.UPDATE} >= {"weights_update"}
    names = {o["name"]: o["op"] for o in ops}
    # the compute regions time Python queueing work, not operators; data loading is one
    assert not {"## forward ##", "## backward ##", "## optimizer ##"} & set(names)
    assert names["## data ##"] == "data_loader"


# --- bounded profiles (issue 14) ----------------------------------------------------------------


def _mx_trace(run: Path) -> list[dict]:
    path = run / "raw" / "rank-00000" / "rank-0.mxnet.json.gz"
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_the_profiler_stops_after_the_window_when_no_step_follows(tmp_path: Path) -> None:
    """The last recorded step used to leave mx.profiler running until the next Trainer step or
    the exit: a job that stopped stepping (here 8 s of NDArray work after its last step, an
    evaluation) had all of it recorded, ~80 MiB/s. It now stops within LINGER_S (1 s)."""
    python = _mxnet_python()
    run = tmp_path / "run"
    result = run_cli(
        "collect", "--no-report", "-o", run, "--skip", "0", "--warmup", "0", "--steps", "2", "--",
        python, REPO / "tests" / "workloads" / "mxnet" / "grow.py",
        "--steps", "3", "--ops", "100", "--tail", "8",
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.code == 0, result.err
    events = [e for e in _mx_trace(run) if "ts" in e]
    step_ends = [
        e["ts"] + e.get("dur", 0) for e in events if str(e.get("name")).startswith("step#")
    ]
    last = max(e["ts"] + e.get("dur", 0) for e in events)
    assert step_ends and (last - max(step_ends)) / 1e6 < 4, "the profiler recorded the tail"
    status = json.loads((run / "raw" / "rank-00000" / "status.json").read_text())
    assert status["state"] == "ok" and status["profiled_steps"] == 2 and not status["stop_reason"]


def test_a_profile_past_the_memory_cap_stops_and_keeps_the_steps_before_it(tmp_path: Path) -> None:
    """3,000 NDArray ops a step, ~15 MiB of profile: past a 100 MiB cap the watching thread stops
    mx.profiler (the process's, not a thread's) and writes the trace; the step in progress never
    ends its Task and is not in it; the job runs on unprofiled."""
    python = _mxnet_python()
    run = tmp_path / "run"
    result = run_cli(
        "collect", "-o", run, "--skip", "0", "--warmup", "1", "--steps", "100",
        "--max-profile-memory", "100M", "--",
        python, REPO / "tests" / "workloads" / "mxnet" / "grow.py", "--steps", "20", "--ops", "3000",
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "step 19:" in result.out and "done" in result.out
    status = json.loads((run / "raw" / "rank-00000" / "status.json").read_text())
    stop = status["stop_step"]
    assert status["stop_reason"] == "memory cap 100 MiB reached" and 2 <= stop < 20
    # The watching thread stops it inside step `stop` (that step dropped), or the step's end
    # sees the cap first (step `stop` ended and is kept): which comes first depends on the
    # load. Either way every kept step is whole and in the report.
    kept = status["profiled_steps"]
    assert kept in (stop - 1, stop) and not status["stop_mid_step"]
    line = f"rank 0: profile stopped at step {stop}: memory cap 100 MiB reached"
    assert f"warning: {line}" in result.out
    report = run_cli("report", run, "--json").json()
    assert [s["step"] for s in report["per_step"]] == list(range(1, kept + 1))
    assert report["incomplete_steps"] == [] and line in report["warnings"]


def test_no_memory_leaves_mxnets_storage_counters_out(tmp_path: Path) -> None:
    """MXNet's profiler records its storage counters unless told not to (profile_memory defaults
    to True there): --no-memory must turn them off, and the resident-memory samples too."""
    python = _mxnet_python()
    run, out = tmp_path / "run", tmp_path / "out"
    command = [
        sys.executable, "-m", "traceview", "collect", "--no-memory", "--no-report", "-o", str(run),
        "--", str(python), str(MX_SAMPLES / "make_traces.py"), "train", "local", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = run_cli("report", run, "--json").json()
    assert report["summary"]["memory"] is None and report["ranks"][0]["memory"] is None
    status = json.loads((run / "raw" / "rank-00000" / "status.json").read_text())
    assert status["rss_samples"] == []
