"""The integration tier's part of ``tests/unit/test_gpu_idle.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SAMPLES, beyond_unit
from tests.unit.test_gpu_idle import RUNS, _host_bound_holds, report
from traceview.model import schema as S
from traceview.runs import ingest_run
from traceview.store import rundir as R


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gpu-idle")
    return {name: ingest_run([SAMPLES / "pytorch" / name], out / name) for name in RUNS}


def test_the_text_report_shows_the_host_bound_part_beside_the_phase(
    runs: dict[str, Path],
) -> None:
    from tests.conftest import run_cli
    from traceview.views.style import HOST_BOUND_NOTE, ms

    result = report(runs["gpu_sync"])
    bound, breakdown = result.summary.host_bound_ms, result.summary.breakdown_ms
    assert bound is not None
    out = run_cli("report", runs["gpu_sync"])
    assert out.code == 0, out.err
    lines = out.out.splitlines()
    for phase in S.GPU_HOST_BOUND_PHASES:
        row = next(x.split() for x in lines if x.split()[:2] == [phase, ms(breakdown[phase])])
        assert row[3] == ms(bound[phase]), row
    assert " ".join(HOST_BOUND_NOTE.split()) in " ".join(out.out.split())


def test_compare_keeps_each_runs_host_bound_part(runs: dict[str, Path], tmp_path: Path) -> None:
    """compare --json puts the runs' host-bound parts side by side: synchronized, the device
    waits for the host launching the optimizer; unsynchronized, it does not (the host runs
    ahead). A CPU run has none (null)."""
    from tests.conftest import run_cli

    cpu = ingest_run([SAMPLES / "pytorch" / "explicit"], tmp_path / "cpu")
    out = run_cli("compare", "--json", runs["gpu_sync"], runs["gpu_async"], cpu)
    assert out.code == 0, out.err
    compared = json.loads(out.out)["runs"]
    for row, run in zip(compared, (runs["gpu_sync"], runs["gpu_async"]), strict=False):
        bound = report(run).summary.host_bound_ms
        assert bound is not None and row["host_bound_ms"] == json.loads(bound.to_json())
    assert compared[0]["host_bound_ms"]["update"] > 0.5 > compared[1]["host_bound_ms"]["update"]
    assert compared[2]["host_bound_ms"] is None


def test_export_writes_the_gpu_tables(runs: dict[str, Path], tmp_path: Path) -> None:
    from tests.conftest import run_cli

    result = run_cli("export", runs["gpu_sync"], "--format", "parquet", "-o", tmp_path / "out")
    assert result.code == 0, result.err
    gpu = R.read_table(tmp_path / "out" / "gpu.parquet", S.GPU_SCHEMA)
    assert gpu.equals(R.read_table(runs["gpu_sync"] / "gpu.parquet", S.GPU_SCHEMA))
    # the stored launches table, its levels apart: (phase, op), phase (op null), all (both null)
    stored = pl.from_arrow(R.read_table(runs["gpu_sync"] / "launches.parquet", S.LAUNCHES_SCHEMA))
    assert isinstance(stored, pl.DataFrame)
    levels = {
        "launches": stored.filter(pl.col(S.PHASE).is_not_null() & pl.col(S.OP).is_not_null()),
        "launches_by_phase": stored.filter(
            pl.col(S.PHASE).is_not_null() & pl.col(S.OP).is_null()
        ).drop(S.OP),
        "launches_by_rank": stored.filter(pl.col(S.PHASE).is_null()).drop(S.PHASE, S.OP),
    }
    assert sum(f.height for f in levels.values()) == stored.height
    for name, level in levels.items():
        exported = pl.read_parquet(tmp_path / "out" / f"{name}.parquet")
        assert exported.equals(level), name


def _shared_inputs() -> list[object]:
    from tests.golden.cases import shared_cases

    cases = shared_cases()
    return beyond_unit(sorted(cases), lambda name: cases[name])


@pytest.mark.parametrize("case", _shared_inputs())
def test_one_host_bound_figure_on_the_shared_traces(case: str, tmp_path: Path) -> None:
    from tests.golden.cases import shared_cases

    path = Path(shared_cases()[case][-1])
    run = ingest_run([path], tmp_path / "run")
    _host_bound_holds(run)
