"""Issue 49: a job that writes one trace file per profiler cycle or per step is one run, each
rank's files read as one trace in time order, its steps numbered as the profiler numbered them.

Ground truth: tests/workloads/windowed_profile.py (2 ranks under torchrun, gloo, DDP) times
each step's work itself; the steps it profiled are known from its schedule (``--per cycle``:
wait 1, warm-up 1, active 2, three times: steps 2-3, 6-7, 10-11, a file each cycle; ``--per
step``: every step a cycle and a file of its own). ~10 s a job on the shared 2-core machine.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli, run_job, run_process
from tests.live.test_parallel_jobs import _launcher

pytestmark = [pytest.mark.torch]

SCRIPT = REPO / "tests" / "workloads" / "windowed_profile.py"
CYCLE_STEPS = [2, 3, 6, 7, 10, 11]


def _profile(out: Path, per: str) -> None:
    """Run the job into ``out``."""
    argv = [*_launcher(), "--nproc-per-node", "2", SCRIPT, "--out", out, "--per", per]
    result = run_job(lambda: run_process(argv), out)
    assert result.code == 0, result.err[-3000:]


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("windows")
    for per in ("cycle", "step"):
        _profile(root / per, per)
    return {"cycle": root / "cycle", "step": root / "step"}


def _report(path: Path) -> dict[str, Any]:
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def _timings(folder: Path) -> list[dict[int, float]]:
    return [
        {int(step): ms for step, ms in json.loads(path.read_text()).items()}
        for path in sorted(folder.glob("timings-*.json"))
    ]


def _agree_with_the_job(report: dict[str, Any], folder: Path) -> None:
    """Each reported step's fastest and slowest rank agree with the job's own timers of that
    step (its work; the profiler's step marker wraps it, a few hundred µs more at most)."""
    timed = _timings(folder)
    for row in report["per_step"]:
        step = row["step"]
        fastest, slowest = min(t[step] for t in timed), max(t[step] for t in timed)
        assert fastest - 0.05 <= row["min_ms"] <= fastest * 1.1 + 1.0, (step, row, fastest)
        assert slowest - 0.05 <= row["max_ms"] <= slowest * 1.1 + 1.0, (step, row, slowest)


def test_one_file_per_cycle_is_one_run_with_the_profilers_step_numbers(
    windows: dict[str, Path],
) -> None:
    folder = windows["cycle"]
    assert len(list(folder.glob("rank0.*.pt.trace.json"))) == 3
    report = _report(folder)
    assert report["run"]["ranks"] == 2
    assert [row["step"] for row in report["per_step"]] == CYCLE_STEPS
    assert not report["incomplete_steps"]
    assert any("3 trace files each" in r for r in report["remarks"]), report["remarks"]
    _agree_with_the_job(report, folder)


def test_one_file_per_step_is_one_run(windows: dict[str, Path]) -> None:
    folder = windows["step"]
    report = _report(folder)
    assert report["run"]["ranks"] == 2
    # (the profiler opens one more window as the job leaves it: a step the job never ran,
    # reported and left out of the figures as trailing)
    ran = len(_timings(folder)[0])
    steps = [row["step"] for row in report["per_step"]]
    assert steps[:ran] == list(range(ran))
    assert steps[ran:] == [ran]
    assert any(f"step {ran} left out" in r and "last step()" in r for r in report["remarks"])
    # (step 0's marker opens as the profiler starts, before the job's first timer: the
    # profiler's own start-up is in it, up to a few ms on a loaded machine)
    timed = [r for r in report["per_step"] if r["step"] in _timings(folder)[0] and r["step"] > 0]
    _agree_with_the_job({"per_step": timed}, folder)


def test_a_rank_whose_later_files_are_missing_is_analysed_up_to_where_it_stopped(
    windows: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(windows["cycle"], folder)
    sorted(folder.glob("rank1.*.pt.trace.json"))[-1].unlink()  # (names hold the time)
    report = _report(folder)
    assert report["run"]["ranks"] == 2
    said = " ".join(report["warnings"])
    assert "rank(s) 1 have fewer trace files than the 3 of rank(s) 0" in said, said
    missing = {row["step"]: row for row in report["incomplete_steps"]}
    assert sorted(missing) == [10, 11]
    assert all(row["untraced_ranks"] == [1] for row in missing.values())
    assert [row["step"] for row in report["per_step"]] == CYCLE_STEPS[:4]
    text = run_cli("report", folder)
    assert "step 10 is not in the traces of rank 1" in text.out


def test_a_copy_of_a_window_is_refused_naming_both_files(
    windows: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(windows["cycle"], folder)
    first = sorted(folder.glob("rank0.*.pt.trace.json"))[0]
    shutil.copy(first, folder / "copy-of-rank0.json")
    result = run_cli("report", folder)
    assert result.code == 2, result.err
    assert "two traces say they are rank 0" in result.err
    assert "cover the same time" in result.err and "copy-of-rank0.json" in result.err
    assert "Traceback" not in result.err


def test_two_runs_in_one_folder_are_refused(windows: dict[str, Path], tmp_path: Path) -> None:
    """tensorboard_trace_handler's folder keeps every run's files: a second run of the job into
    it is another process for each rank, not more windows of the first."""
    folder = tmp_path / "traces"
    shutil.copytree(windows["cycle"], folder)
    # (run apart, then put beside the first: a job retried after a death starts afresh)
    _profile(tmp_path / "second", "cycle")
    for path in (tmp_path / "second").glob("*.pt.trace.json"):
        shutil.copy(path, folder / path.name)
    result = run_cli("report", folder)
    assert result.code == 2, result.err
    assert "two traces say they are rank" in result.err
    assert "different processes" in result.err


def test_one_process_without_a_process_group_is_one_rank(tmp_path: Path) -> None:
    """Its traces state no rank and its file names none either (the handler's own
    host_pid.time names): one process's files are one rank, not three."""
    argv = [sys.executable, SCRIPT, "--out", tmp_path, "--per", "cycle", "--single"]
    result = run_process(argv)
    assert result.code == 0, result.err[-3000:]
    assert len(list(tmp_path.glob("*.pt.trace.json"))) == 3
    report = _report(tmp_path)
    assert report["run"]["ranks"] == 1
    assert [row["step"] for row in report["per_step"]] == CYCLE_STEPS
    _agree_with_the_job(report, tmp_path)
