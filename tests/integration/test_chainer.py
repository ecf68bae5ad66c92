"""The integration tier's part of ``tests/unit/test_chainer.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.unit.test_chainer import MLP
from traceview.runs import ingest_run


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingest_run([MLP], tmp_path_factory.mktemp("chainer") / "mlp")


def test_report_names_the_framework(mlp_run: Path) -> None:
    report = run_cli("report", mlp_run, "--json").json()
    assert report["run"]["framework"] == "chainer"
    assert report["summary"]["hidden"] == "no"  # the all-reduce runs after backward
