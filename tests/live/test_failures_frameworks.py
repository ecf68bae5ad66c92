"""Issue 49's ground truth beyond PyTorch: the step record of ChainerMN, TensorFlow and MXNet
ranks (every step of the run, its data loading and its collective calls, where the framework
makes them from Python) names the fault a job injected: its kind, rank, step and phase, and the
call the other ranks waited in. The jobs (tests/workloads/failures/faulty_chainer.py,
faulty_single.py) write what they injected to truth/fault.json.

MPI and a single process have no collective timeout: the job is ended from outside, as a
scheduler's time limit would (``mpirun --timeout``, ``timeout``). About 25 s a job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import REPO, run_cli
from tests.live.test_chainer import _chainer_python, _root_flags
from tests.live.test_mxnet import _mxnet_python

FAILURES = REPO / "tests" / "workloads" / "failures"
LIMIT_S = "20"  # the job's time limit (a hang's end)


def _collect(out: Path, job: list[str | Path], failed: bool = True) -> dict[str, Any]:
    """Collect the job into ``out/run``; its report and the truth it wrote."""
    result = run_cli("collect", "-o", out / "run", "--stall", "3", "--no-report", "--", *job)
    assert (result.code != 0) == failed, result.err[-3000:]
    report = run_cli("report", out / "run", "--json")
    assert report.code == 0, report.err
    return {
        "report": json.loads(report.out),
        "truth": json.loads((out / "truth" / "fault.json").read_text()),
    }


def _recorded_steps(run: Path, rank: int, tmp_path: Path) -> list[int]:
    """The steps of ``rank`` in the step record, as ``export`` writes it."""
    out = tmp_path / "export"
    result = run_cli("export", run, "-o", out)
    assert result.code == 0, result.err
    steps = pl.read_parquet(next(out.rglob("record_steps.parquet")))
    return sorted(steps.filter(pl.col("rank") == rank)["step"].to_list())


def _chainer(tmp_path: Path, fault: str, rank: int, step: int) -> dict[str, Any]:
    python = _chainer_python()
    job = [
        python.with_name("mpirun"), *_root_flags(), "--timeout", "25", "-np", "2", python,
        FAILURES / "faulty_chainer.py", "--fault", fault, "--rank", str(rank), "--step",
        str(step), "--truth", tmp_path / "truth",
    ]  # fmt: skip
    return _collect(tmp_path, job)


def test_a_chainermn_rank_stuck_loading_data_is_the_hang(tmp_path: Path) -> None:
    """Rank 1's iterator never hands over the batch of step 5: the hang is rank 1's, at step 5,
    in data loading; rank 0 waited in that step's gradient all-reduce (the communicator's call
    6: the first update's broadcast, then one all-reduce a step)."""
    got = _chainer(tmp_path, "hang-io", rank=1, step=5)
    f, truth = got["report"]["failure"], got["truth"]
    assert f is not None, got["report"]["ranks_at_end"]
    assert (f["kind"], f["rank"], f["step"], f["phase"]) == ("hang", 1, truth["step"], "io"), f
    assert (f["op"], f["group"], f["seq"]) == ("all_reduce", "chainermn", truth["step"] + 1), f
    assert f["waiting"] == [0]
    assert "__next__" in [frame["function"] for frame in f["stack"]]
    ends = {r["rank"]: r for r in got["report"]["ranks_at_end"]}
    assert (ends[1]["state"], ends[0]["state"]) == ("stuck", "blocked"), ends
    # every step before the stuck one has its row: the run, not only its profiled window
    assert _recorded_steps(tmp_path / "run", 1, tmp_path) == list(range(truth["step"]))


def test_a_chainermn_rank_that_raises_is_the_crash(tmp_path: Path) -> None:
    got = _chainer(tmp_path, "raise", rank=0, step=7)
    f = got["report"]["failure"]
    assert f is not None and (f["kind"], f["rank"], f["step"]) == ("crash", 0, 7), f
    assert "RuntimeError: injected fault at step 7" in f["detail"]
    assert f["waiting"] == [1] and f["op"] == "all_reduce" and f["seq"] == 8, f


def _tensorflow() -> None:
    probe = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("TensorFlow is not installed in this environment")


def _single(tmp_path: Path, python: Path | str, framework: str, fault: str) -> dict[str, Any]:
    job = [
        "timeout", "-k", "3", LIMIT_S, python, FAILURES / "faulty_single.py",
        "--framework", framework, "--fault", fault, "--step", "5", "--truth", tmp_path / "truth",
    ]  # fmt: skip
    return _collect(tmp_path, job)


@pytest.mark.parametrize("framework", ["tf", "tf-fit", "mxnet"])
def test_a_rank_that_raises_loading_data_is_the_crash_at_its_step(
    tmp_path: Path, framework: str
) -> None:
    """The batch of step 5 raises in the framework's loader (inside TensorFlow's graph, which
    wraps it in its own error): the crash is at step 5, in data loading, in the script's words,
    not the wrapper's traceback; steps 0-4 are recorded whole."""
    python = _mxnet_python() if framework == "mxnet" else sys.executable
    if framework != "mxnet":
        _tensorflow()
    got = _single(tmp_path, python, framework, "raise")
    f, truth = got["report"]["failure"], got["truth"]
    assert f is not None and (f["kind"], f["rank"], f["step"]) == ("crash", 0, truth["step"]), f
    assert "RuntimeError: injected fault loading the batch of step 5" in f["detail"]
    assert "Traceback" not in f["detail"] and "\n" not in f["detail"], f["detail"]
    # where it raised: data loading, left as the exception unwound (Keras reads in the graph)
    assert f["phase"] == (None if framework == "tf-fit" else "io"), f
    assert _recorded_steps(tmp_path / "run", 0, tmp_path) == list(range(truth["step"]))


@pytest.mark.parametrize("framework", ["tf", "mxnet"])
def test_a_rank_stuck_loading_data_is_the_hang_in_data_loading(
    tmp_path: Path, framework: str
) -> None:
    """The batch of step 5 never comes (a Python loop over ``tf.data``, a Gluon DataLoader):
    the hang is at step 5, in data loading. (Keras' ``fit`` reads its batches inside the graph:
    the record knows the step, not the phase.)"""
    python = _mxnet_python() if framework == "mxnet" else sys.executable
    if framework != "mxnet":
        _tensorflow()
    got = _single(tmp_path, python, framework, "hang-io")
    f, truth = got["report"]["failure"], got["truth"]
    assert f is not None, got["report"]["ranks_at_end"]
    assert (f["kind"], f["rank"], f["step"], f["phase"]) == ("hang", 0, truth["step"], "io"), f
    assert got["report"]["ranks_at_end"][0]["state"] == "stuck"
