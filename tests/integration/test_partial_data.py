"""A folder with good traces and damaged files: the good ranks are kept and reported, with one
warning per damaged file (issue 14); only a folder with nothing readable is an error."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, needs_xprof, run_cli

GOOD = SAMPLES / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz"


def _empty(folder: Path) -> Path:
    path = folder / "rank-1.pt.trace.json"
    path.write_bytes(b"")
    return path


def _corrupt_gzip(folder: Path) -> Path:
    data = gzip.compress((SAMPLES / "pytorch" / "ddp" / "rank-1.pt.trace.json.gz").read_bytes())
    path = folder / "rank-1.pt.trace.json.gz"
    path.write_bytes(data[:10] + bytes(b ^ 0x5A for b in data[10:4000]))
    return path


def _eventless(folder: Path) -> Path:
    path = folder / "rank-1.pt.trace.json"
    path.write_text('{"schemaVersion": 1, "distributedInfo": {"rank": 1}, "traceEvents": []}')
    return path


def _garbage_xplane(folder: Path) -> Path:
    path = folder / "host.xplane.pb"
    path.write_bytes(bytes(range(256)) * 12)
    return path


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("alone")
    shutil.copy(GOOD, folder)
    result = run_cli("report", "--json", folder)
    assert result.code == 0, result.err
    return result.json()


@pytest.mark.parametrize(
    "damage",
    # without xprof, no .xplane.pb is read: the warning names the rank, not the damaged file
    [_empty, _corrupt_gzip, _eventless, pytest.param(_garbage_xplane, marks=needs_xprof)],
)
def test_a_damaged_file_costs_only_itself(
    tmp_path: Path, damage: Callable[[Path], Path], alone: dict
) -> None:
    shutil.copy(GOOD, tmp_path)
    bad = damage(tmp_path)
    result = run_cli("report", "--json", tmp_path)
    assert result.code == 0, result.err
    report = result.json()
    assert [r["rank"] for r in report["ranks"]] == [0]
    assert report["summary"]["breakdown_ms"] == alone["summary"]["breakdown_ms"]
    named = [w for w in report["warnings"] if bad.name in w]
    assert len(named) == 1, report["warnings"]
    assert "internal" not in result.err


def test_a_folder_of_damaged_files_only_is_one_line_naming_one(tmp_path: Path) -> None:
    _empty(tmp_path)
    (tmp_path / "more").mkdir()
    _corrupt_gzip(tmp_path / "more")
    result = run_cli("report", tmp_path)
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert "no readable traces" in result.err and "corrupt gzip data" in result.err


def test_a_ranks_windows_whose_step_numbers_begin_again_count_each_step_once(
    tmp_path: Path,
) -> None:
    """Two trace files of rank 0, one after the other, both of steps 2-6 (two runs' traces, or
    windows numbered alike): the later steps are set aside, named in one warning; each step is
    one row of the run."""
    from tests.hostile_wave4 import _AFTER_US, _kineto_window

    (tmp_path / "rank-0.a.pt.trace.json.gz").write_bytes(_kineto_window(0.0))
    (tmp_path / "rank-0.b.pt.trace.json.gz").write_bytes(_kineto_window(_AFTER_US))
    shutil.copy(SAMPLES / "pytorch" / "slowio" / "rank-1.pt.trace.json.gz", tmp_path)
    result = run_cli("report", "--json", tmp_path)
    assert result.code == 0, result.err
    report = result.json()
    assert [(r["rank"], r["steps"]) for r in report["ranks"]] == [(0, 5), (1, 5)]
    said = [w for w in report["warnings"] if "begin again" in w]
    assert said == [
        "rank 0: step number(s) 2-6 begin again later in the trace(s) (traces of two runs, or "
        "profiler windows numbered alike?): the first of each is counted, the 5 later one(s) "
        "set aside"
    ]
