"""Jobs that die badly under ``traceview collect`` (issue 36): one case of each class, in the
default command. The classes, the checks and every other variant: tests/collect_faults.py and
tests/fuzz/test_collect_faults.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import collect_faults as F

pytestmark = pytest.mark.mpi


def test_a_launcher_sigkilled_leaves_no_rank_running(tmp_path: Path) -> None:
    F.launcher_ends(tmp_path, "PyTorch ranks, launcher SIGKILLed")


def test_a_hostile_status_costs_a_warning(tmp_path: Path) -> None:
    F.hostile_status(tmp_path, "nested 100,000 deep")


def test_a_read_only_run_directory_is_refused_before_the_job(tmp_path: Path) -> None:
    F.unwritable(tmp_path, "read-only file system")


def test_a_full_disk_passes_the_job_s_exit_code(tmp_path: Path) -> None:
    F.full_disk(tmp_path, "full after the trace (the ingest)")


def test_ctrl_c_before_pytorch_is_an_interruption(tmp_path: Path) -> None:
    F.interrupted(tmp_path, "Ctrl-C before PyTorch")


def test_ctrl_c_before_any_process_of_the_job_exits_130(tmp_path: Path) -> None:
    F.interrupted_before_the_job(tmp_path, "SIGINT")
