"""The run directory caches the analysis, never a reason to re-ingest: tables written by another
analysis version, or missing, are recomputed from the events and equal a fresh ingest's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from traceview import rundir as R
from traceview.analysis import ANALYSIS_VERSION
from traceview.runs import ingest_run, open_run


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingest_run([SAMPLES / "pytorch" / "ddp"], tmp_path_factory.mktemp("rundir") / "run")


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_ingest_stamps_the_analysis_version(fresh: Path) -> None:
    assert R.read_manifest(fresh).analysis_version == ANALYSIS_VERSION


def test_tables_of_another_analysis_version_are_recomputed_and_cached(
    fresh: Path, tmp_path: Path
) -> None:
    run = _copy(fresh, tmp_path)
    manifest = R.read_manifest(run)
    (run / R.MANIFEST).write_text(json.dumps({**manifest.to_builtins(), "analysis_version": "0"}))
    # an older analysis wrote different numbers: they must not be read back
    R.write_parquet(run / R.STEPS, R.read_steps(fresh).slice(0, 1))
    with open_run([run]) as opened:
        assert opened.steps.equals(R.read_steps(fresh))
        assert opened.ops.equals(R.read_ops(fresh))
        assert not opened.temporary
    assert R.read_manifest(run).analysis_version == ANALYSIS_VERSION
    assert R.read_steps(run).equals(R.read_steps(fresh)), "the fresh tables are cached"


def test_missing_tables_are_recomputed_from_the_events(fresh: Path, tmp_path: Path) -> None:
    run = _copy(fresh, tmp_path)
    (run / R.STEPS).unlink()
    (run / R.OPS).unlink()
    with open_run([run]) as opened:
        report = json.loads(opened.report().to_json())
    with open_run([fresh]) as original:
        expected = json.loads(original.report().to_json())
    assert report["run"].pop("path") == str(run)
    expected["run"].pop("path")
    assert report == expected
