"""Chainer and ChainerMN: traceview collect's own Chainer collector, its trace, and the breakdown
held to the training loop's timers.

- sample_traces/chainer/mlp is a real 2-rank ChainerMN run (naive communicator, CPU, mpirun)
  of the MLP the PyTorch, TensorFlow and MXNet samples train, made by make_traces.py under
  `traceview collect`; its loop times io, forward, backward, the explicit
  ``multi_node_mean_grad`` and the update of every step (groundtruth.json).
- Timers and the collector's hooks read the same clock around the same calls, so timers alone
  cannot fail. What they cannot fake is held too: each recorded FunctionNode lies inside its
  step's forward or backward call, the outermost ones never overlap and cover that call but for
  Chainer's own bookkeeping between them, and the nodes a backward runs lie inside it.
- The live tests run new jobs in the Chainer environment (.venv-chainer, made by
  tests/make_envs.sh; TRACEVIEW_CHAINER_PYTHON points elsewhere) and skip, saying why, without it.

Tolerances: the sample, per step within max(0.5 ms, 10 %) of each timer, per-rank means within
max(0.3 ms, 5 %), where a phase may also come out short by its step's idle time (the sample was
made on a loaded machine: a rank descheduled between a timer read and the traced call); live
runs (made while the tests load the two cores): per step within max(1 ms, 15 %), where a phase
may also come out short by the idle time of its step and the next (a rank descheduled after the
step's marker ended, before the loop's timer read).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.unit.test_chainer import MLP
from traceview.store.analysed import ingest_run


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingest_run([MLP], tmp_path_factory.mktemp("chainer") / "mlp")


def test_report_names_the_framework(mlp_run: Path) -> None:
    report = run_cli("report", mlp_run, "--json").json()
    assert report["run"]["framework"] == "chainer"
    assert report["summary"]["hidden"] == "no"  # the all-reduce runs after backward
