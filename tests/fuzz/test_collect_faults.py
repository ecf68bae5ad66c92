"""The corpus of jobs that die badly under ``traceview collect`` (issue 36), every variant:
what each class is and what every case checks is said at the top of tests/collect_faults.py.
Not collected by default: ``python -m pytest -m fuzz tests/fuzz/test_collect_faults.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import collect_faults as F

pytestmark = [pytest.mark.fuzz, pytest.mark.mpi]


@pytest.mark.parametrize("name", sorted(F.LAUNCHER_ENDS))
def test_launcher_ends(name: str, tmp_path: Path) -> None:
    F.launcher_ends(tmp_path, name)


@pytest.mark.parametrize("name", sorted(F.STATUSES))
def test_hostile_status(name: str, tmp_path: Path) -> None:
    F.hostile_status(tmp_path, name)


@pytest.mark.parametrize("name", F.UNWRITABLE)
def test_unwritable_run_directory(name: str, tmp_path: Path) -> None:
    F.unwritable(tmp_path, name)


@pytest.mark.parametrize("name", sorted(F.FULL))
def test_full_file_system(name: str, tmp_path: Path) -> None:
    F.full_disk(tmp_path, name)


@pytest.mark.parametrize("name", sorted(F.INTERRUPTS))
def test_interrupted(name: str, tmp_path: Path) -> None:
    F.interrupted(tmp_path, name)


@pytest.mark.parametrize("name", sorted(F.EARLY_INTERRUPTS))
def test_interrupted_before_the_job(name: str, tmp_path: Path) -> None:
    F.interrupted_before_the_job(tmp_path, name)
