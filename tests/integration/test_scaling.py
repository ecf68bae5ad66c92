"""The integration tier's part of ``tests/unit/test_scaling.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli

SCALING = SAMPLES / "pytorch" / "scaling"
COUNTS = (1, 2, 4)


def timers(n: int) -> dict:
    truth = json.loads((SCALING / f"ranks-{n}" / "groundtruth.json").read_text())
    profiled = [r for r in truth["records"] if r["profiled"]]
    truth["step_ms"] = statistics.mean(r["step_ms"] for r in profiled)
    return truth


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Each scaling run ingested once, as a user would keep it."""
    out = tmp_path_factory.mktemp("scaling")
    paths = {}
    for n in COUNTS:
        result = run_cli("ingest", SCALING / f"ranks-{n}", "-o", out / f"ranks-{n}")
        assert result.code == 0, result.err
        paths[n] = out / f"ranks-{n}"
    return paths


@pytest.fixture(scope="module")
def analysis(runs: dict[int, Path]) -> dict:
    # given out of order on purpose: the result is ordered by rank count
    result = run_cli("scaling", runs[4], runs[1], runs[2], "--json", "--link-gbps", "10")
    assert result.code == 0, result.err
    return result.json()


def test_runs_are_ordered_by_rank_count_with_the_contract_keys(analysis: dict) -> None:
    assert [r["ranks"] for r in analysis["runs"]] == list(COUNTS)
    for run in analysis["runs"]:
        for key in ("ranks", "step_ms", "speedup", "efficiency", "predicted"):
            assert key in run
        assert set(run["predicted"]) == {"sequential", "pipelined", "overlapped"}
        for prediction in run["predicted"].values():
            assert prediction["step_ms"] > 0 and prediction["speedup"] > 0


def test_speedup_and_efficiency_follow_weak_scaling(analysis: dict, runs: dict[int, Path]) -> None:
    """S(N) = N * t(1) / t(N) and efficiency S/N, with t from each run's own report."""
    step = {n: run_cli("report", runs[n], "--json").json()["summary"]["step_ms"] for n in COUNTS}
    for run in analysis["runs"]:
        n = run["ranks"]
        assert run["step_ms"] == pytest.approx(step[n])
        assert run["speedup"] == pytest.approx(n * step[1] / step[n], abs=2e-3)
        assert run["efficiency"] == pytest.approx(run["speedup"] / n, abs=2e-3)


def test_measured_speedup_agrees_with_the_timers(analysis: dict) -> None:
    """The speedup traceview measures from the traces is the one the training loop's timers see."""
    t1 = timers(1)["step_ms"]
    for run in analysis["runs"]:
        n = run["ranks"]
        expected = n * t1 / timers(n)["step_ms"]
        assert run["speedup"] == pytest.approx(expected, rel=0.10), (n, run["speedup"], expected)


def test_throughput_uses_the_batch_size_read_off_the_input_shapes(analysis: dict, runs) -> None:
    batch = timers(1)["batch_size"]
    for run in analysis["runs"]:
        assert run["batch_size"] == batch and run["batch_size_from"] == "input shapes"
        assert run["samples_per_s"] == pytest.approx(
            run["ranks"] * batch / (run["step_ms"] / 1e3), rel=1e-3
        )
    given = run_cli("scaling", runs[1], runs[2], "--batch-size", "32", "--json").json()
    assert all(r["batch_size"] == 32 and r["batch_size_from"] == "user" for r in given["runs"])


def test_allreduce_volume_is_the_models_gradients(analysis: dict) -> None:
    """DDP all-reduces every gradient once per step: the traced bytes are the model's."""
    gradient_bytes = timers(2)["gradient_bytes"]
    for run in analysis["runs"][1:]:
        allreduce = run["allreduce"]
        assert allreduce["bytes_per_step"] == pytest.approx(gradient_bytes, rel=0.01)
        # gradient bytes / (t_comm x bandwidth), t_comm the transfer (waiting for the last rank
        # to arrive moves no bytes)
        assert run["comm_model_ms"] < run["comm_total_ms"]
        expected = gradient_bytes * 8 / (run["comm_model_ms"] / 1e3) / 10e9
        assert allreduce["efficiency"] == pytest.approx(expected, rel=0.02)
    assert analysis["runs"][0]["allreduce"] is None  # one rank: nothing crosses a link


def test_layerwise_model_explains_the_exposed_communication(analysis: dict) -> None:
    """With each run's own compute, replaying its collectives on its backward predicts the step.

    DDP hides part of its all-reduces behind backward: a model that adds all communication to
    the step (sequential) must overshoot, and the layer-wise overlap model must come closer.
    If traceview attributed hidden communication as exposed (or the reverse), or read the issue
    times of the buckets wrongly, these would not hold.
    """
    for run in analysis["runs"][1:]:
        own = run["predicted_own_compute"]
        assert own["sequential"]["step_ms"] > run["step_ms"] * 1.05
        assert own["overlapped"]["error"] < 0.10, run
        assert own["overlapped"]["error"] < own["sequential"]["error"]


def test_compute_growth_is_measured_against_the_timers(analysis: dict) -> None:
    """compute_ratio follows the forward+backward+optimizer timers (4 ranks share 2 cores here)."""

    def compute(n: int) -> float:
        records = [r for r in timers(n)["records"] if r["profiled"]]
        return statistics.mean(r["forward_ms"] + r["optimizer_ms"] for r in records)

    for run in analysis["runs"]:
        # forward and update have no communication inside them: compare those timers' growth
        b = run["breakdown_ms"]
        base = analysis["base"]["breakdown_ms"]
        ours = (b["forward"] + b["update"]) / (base["forward"] + base["update"])
        assert ours == pytest.approx(compute(run["ranks"]) / compute(1), rel=0.15)
    if analysis["runs"][-1]["compute_ratio"] > 1.2:
        assert any("compute per step grows" in note for note in analysis["notes"])


def test_what_ifs(analysis: dict, runs: dict[int, Path]) -> None:
    for run in analysis["runs"]:
        w = run["what_if"]
        assert w["comm_hidden_ms"] == pytest.approx(
            run["step_ms"] - run["comm_exposed_ms"], abs=2e-3
        )
        assert w["io_hidden_ms"] == pytest.approx(
            run["step_ms"] - run["breakdown_ms"]["io"], abs=2e-3
        )
        assert w["comm_hidden_ms"] <= w["comm_2x_faster_ms"] <= run["step_ms"] + 1e-3
    # communication "1x faster" changes nothing
    same = run_cli("scaling", runs[1], runs[2], "--faster-comm", "1", "--json").json()
    for run in same["runs"]:
        assert run["what_if"]["comm_1x_faster_ms"] == pytest.approx(run["step_ms"], abs=2e-3)


def test_text_output_reads_well_at_80_columns(runs: dict[int, Path]) -> None:
    result = run_cli("scaling", *(runs[n] for n in COUNTS), env={"COLUMNS": "80"})
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("traceview scaling · 3 runs")
    assert any(line.startswith("best fit: ") for line in lines)
    measured = [line.split() for line in lines if line.startswith("ranks-")]
    assert [row[1] for row in measured[:3]] == ["1", "2", "4"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["ranks-1"], "at least two runs"),
        (["ranks-2", "ranks-2"], "same number of ranks"),
        (["ranks-1", "ranks-2", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(
    runs: dict[int, Path], args: list[str], fragment: str
) -> None:
    resolved = [str(runs[int(a.split("-")[1])]) if a.startswith("ranks-") else a for a in args]
    result = run_cli("scaling", *resolved)
    assert result.code == 2
    assert fragment in result.err and len(result.err.strip().splitlines()) == 1
    assert "Traceback" not in result.err


def test_a_step_that_did_not_finish_on_every_rank_is_left_out_of_the_models(
    tmp_path: Path,
) -> None:
    """Issue 14: steps that did not complete on every rank are left out of scaling too. The
    2-rank run with its last step (ProfilerStep#6) missing on rank 1 only (rank 0 waited for it)
    must scale exactly as the same run with that step removed on both ranks: the layer-wise
    model used to replay rank 0's collectives of that step."""
    import gzip

    source = SCALING / "ranks-2"
    docs = {r: json.loads(gzip.decompress((source / f"rank-{r}.pt.trace.json.gz").read_bytes()))
            for r in (0, 1)}  # fmt: skip

    def without_last_step(doc: dict) -> dict:
        events = doc["traceEvents"]
        last = max(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
        return {**doc, "traceEvents": [e for e in events if "ts" not in e or e["ts"] < last]}

    results = {}
    for name, cut in (("neither", (0, 1)), ("rank1", (1,))):
        folder = tmp_path / name
        folder.mkdir()
        for rank, doc in docs.items():
            text = json.dumps(without_last_step(doc) if rank in cut else doc)
            (folder / f"rank-{rank}.pt.trace.json").write_text(text)
        result = run_cli("scaling", "--json", SCALING / "ranks-1", folder)
        assert result.code == 0, result.err
        results[name] = result.json()
    report = run_cli("report", "--json", tmp_path / "rank1").json()
    assert [s["step"] for s in report["incomplete_steps"]] == [6]
    for result in results.values():
        result["runs"][1].pop("label")
    assert results["rank1"] == results["neither"]


def test_a_run_missing_ranks_is_not_taken_as_a_smaller_run(tmp_path: Path) -> None:
    """Three of a 4-rank job's traces (each says world size 4) are part of that job: their step
    is the 4-rank job's. Refused in one line; with --allow-partial, taken and said so."""
    import shutil

    partial = tmp_path / "three-of-four"
    partial.mkdir()
    for rank in range(3):
        name = f"rank-{rank}.pt.trace.json.gz"
        shutil.copy(SCALING / "ranks-4" / name, partial / name)
    args = ["scaling", SCALING / "ranks-1", SCALING / "ranks-2", partial]
    refused = run_cli(*args)
    assert refused.code == 2, refused.err
    lines = refused.err.strip().splitlines()
    assert len(lines) == 1 and "holds 3 of its job's 4 ranks" in lines[0], refused.err
    assert "--allow-partial" in lines[0]
    taken = run_cli(*args, "--allow-partial", "--json")
    assert taken.code == 0, taken.err
    result = taken.json()
    assert [r["ranks"] for r in result["runs"]] == [1, 2, 3]
    assert [n for n in result["notes"] if "holds 3 of its job's 4 ranks" in n], result["notes"]
