"""Fresh runs: train under mpirun now, profile, and hold traceview to this run's own timers.

The committed sample traces could hide a regression in how today's PyTorch writes traces; these
tests make new ones with the same script (sample_traces/pytorch/make_traces.py: CPU PyTorch,
gloo, 2 ranks) and apply the same checks, a little looser per step since the machine running
the tests is busy running them (two ranks, their gloo threads and pytest share two cores).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, analysed, run_job, run_process
from tests.unit.test_groundtruth import check_against_timers, steps_with_timers
from traceview.analysis.summary import RunInputs, summarize
from traceview.runs import ingest_run
from traceview.store import rundir as R

pytestmark = pytest.mark.mpi


def _mpirun() -> list[str]:
    mpirun = shutil.which("mpirun") or shutil.which("mpirun", path=str(Path(sys.executable).parent))
    if mpirun is None:
        pytest.skip("mpirun not found (pip install -e '.[mpi]' provides Open MPI)")
    pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU build)")
    flags = ["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else ["--oversubscribe"]
    return [mpirun, *flags, "-np", "2"]


@pytest.fixture(scope="module", params=["explicit", "ddp"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    scenario = request.param
    out = tmp_path_factory.mktemp(f"live-{scenario}")
    env = {**os.environ, "MASTER_PORT": str(29600 + ["explicit", "ddp"].index(scenario))}
    cmd = [
        *_mpirun(),
        sys.executable,
        str(SAMPLES / "pytorch" / "make_traces.py"),
        scenario,
        str(out),
    ]
    # a rank of the training script itself (no traceview in it) was once seen to abort in
    # PyTorch's teardown after its profiler stopped: run_job runs the job once more then
    proc = run_job(lambda: run_process(cmd, env=env), out)
    assert proc.code == 0, proc.out[-2000:] + proc.err[-2000:]
    return scenario, out, ingest_run([out], out / "run")


def test_fresh_run_matches_its_timers(live: tuple[str, Path, Path]) -> None:
    scenario, out, run = live
    # A rank preempted between a timer call and the profiler's record function shows up as up
    # to a millisecond between the two in a single step: per step, allow 1 ms or 15 %, and in
    # one step per rank twice that (once seen: forward 10.39 ms against its timer's 9.03 ms in
    # one step of a ddp run while the suite loaded both cores), or by a scheduler slice of
    # 4 ms where that is more (seen in CI: forward 14.09 ms against 10.22 ms, one step of one
    # rank; the others and the mean held).
    check_against_timers(
        steps_with_timers(run, out),
        f"fresh {scenario}",
        per_step=0.15,
        mean=0.08,
        floor_ms=1.0,
        idle_may_explain=True,
        preempted=1,
        slice_ms=4.0,
    )


def test_fresh_run_hidden_verdict(live: tuple[str, Path, Path]) -> None:
    scenario, _, run = live
    summary = summarize(
        RunInputs(R.read_manifest(run), {"steps": analysed(run).steps, "ops": analysed(run).ops})
    ).summary
    if scenario == "explicit":
        assert summary.hidden == "no"
    else:
        assert summary.comm_hidden_fraction > 0.1
