"""Issue 49: Flight Recorder dumps a user already has, as PyTorch wrote them (real gloo dumps of
tests/workloads/failures/fr_dumps.py: 3 ranks under torchrun, one rank stuck before a known
call), read with `traceview report DUMPS/`: with or without traces, beside other files, as
pickles, JSON or both. ~10 s a job on the shared 2-core machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli, run_job, run_process
from tests.live.test_parallel_jobs import _launcher

pytestmark = [pytest.mark.torch]

SCRIPT = REPO / "tests" / "workloads" / "failures" / "fr_dumps.py"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import os

    root = tmp_path_factory.mktemp("dumps")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "200"}
    made = {}
    for fault in ("hang", "none"):
        out = root / fault
        argv = [*_launcher(), "--nproc-per-node", "3", SCRIPT, "--out", out, "--fault", fault,
                "--rank", "1", "--call", "4"]  # fmt: skip
        result = run_job(lambda argv=argv: run_process(argv, env=env), out)
        assert result.code == 0, result.err[-3000:]
        made[fault] = out
    return made


def _report(path: Path) -> dict[str, Any]:
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def _hang_is_named(report: dict[str, Any], truth: dict[str, Any]) -> None:
    f = report["failure"]
    assert f is not None, report["remarks"]
    assert (f["kind"], f["rank"], f["seq"], f["op"]) == ("hang", truth["rank"], truth["call"],
                                                         "all_reduce")  # fmt: skip
    others = [r for r in range(truth["world"]) if r != truth["rank"]]
    assert f["waiting"] == others
    states = {r["rank"]: r["state"] for r in report["ranks_at_end"]}
    assert states == {r: "stuck" if r == truth["rank"] else "blocked" for r in range(3)}
    assert "Flight Recorder dumps" in f["evidence"]


def test_a_folder_of_dumps_names_the_stuck_rank_and_the_call_the_others_wait_in(
    dumps: dict[str, Path],
) -> None:
    truth = json.loads((dumps["hang"] / "truth.json").read_text())
    assert sorted(p.name for p in dumps["hang"].glob("nccl_trace_rank_*")) == [
        f"nccl_trace_rank_{r}" for r in range(3)
    ]
    report = _report(dumps["hang"])
    _hang_is_named(report, truth)
    assert len(report["ranks_at_end"]) == 3  # (each rank's pickle and JSON: one dump)
    text = run_cli("report", dumps["hang"])
    assert text.code == 0 and "the job hung: rank 1 was stuck" in text.out


@pytest.mark.parametrize("keep", ["pickle", "json"])
def test_pickles_alone_or_json_alone_say_the_same(
    dumps: dict[str, Path], tmp_path: Path, keep: str
) -> None:
    folder = tmp_path / "dumps"
    shutil.copytree(dumps["hang"], folder)
    pattern = "fr-rank*.json" if keep == "pickle" else "nccl_trace_rank_*"
    for path in folder.glob(pattern):
        path.unlink()
    _hang_is_named(_report(folder), json.loads((folder / "truth.json").read_text()))


def test_dumps_of_a_healthy_job_show_no_failure(dumps: dict[str, Path]) -> None:
    report = _report(dumps["none"])
    assert report["failure"] is None
    assert {r["state"] for r in report["ranks_at_end"]} == {"running"}
    assert {r["last_seq"] for r in report["ranks_at_end"]} == {6}


def test_dumps_beside_traces_join_their_report(dumps: dict[str, Path], tmp_path: Path) -> None:
    """Traces of a 3-rank job with the dumps in the same folder: the breakdown from the traces,
    the failure from the dumps."""
    folder = tmp_path / "both"
    shutil.copytree(REPO / "sample_traces" / "pytorch" / "slowfwd", folder / "traces")
    shutil.copytree(dumps["hang"], folder / "dumps")
    report = _report(folder)
    assert report["run"]["ranks"] == 3 and report["run"]["steps"] > 0
    said = " ".join(report["remarks"])
    assert "6 Flight Recorder dump(s) beside the traces" in said, said  # (3 pickles, 3 JSON)
    assert not any("not traces" in r and "nccl_trace_rank" in r for r in report["remarks"])
    _hang_is_named(report, json.loads((folder / "dumps" / "truth.json").read_text()))


def test_an_ingested_run_keeps_the_dumps_it_found(dumps: dict[str, Path], tmp_path: Path) -> None:
    """`ingest` lists the dumps beside the traces in the manifest: its reports read those (not
    every file of the inputs again), and still name the hang."""
    folder = tmp_path / "both"
    shutil.copytree(REPO / "sample_traces" / "pytorch" / "slowfwd", folder / "traces")
    shutil.copytree(dumps["hang"], folder / "dumps")
    run = tmp_path / "run"
    result = run_cli("ingest", folder, "-o", run)
    assert result.code == 0, result.err
    listed = json.loads((run / "manifest.json").read_text())["flight_dumps"]
    names = [Path(p).name for p in listed]  # (3 pickles, 3 JSON; not the ranks' logs)
    assert len(names) == 6 and not any(n.endswith(".log") or n == "truth.json" for n in names)
    report = _report(run)
    _hang_is_named(report, json.loads((folder / "dumps" / "truth.json").read_text()))
