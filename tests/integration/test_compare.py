"""`traceview compare` on real runs: phases, hidden communication and operators side by side.

Expectations come from each run's own report, from the ground-truth timers beside the sample
traces and from what the scenarios are built to show, never from the comparison's output.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli, shared_traces

PYTORCH = SAMPLES / "pytorch"


def timer_means(scenario: str) -> dict[str, float]:
    truth = json.loads((PYTORCH / scenario / "groundtruth.json").read_text())
    records = [r for r in truth["records"] if r["profiled"]]
    return {k: statistics.mean(r[k] for r in records) for k in records[0] if k.endswith("_ms")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("compare")
    paths = {}
    for scenario in ("ddp", "explicit", "slowio", "gpu_sync", "gpu_async"):
        result = run_cli("ingest", PYTORCH / scenario, "-o", out / scenario)
        assert result.code == 0, result.err
        paths[scenario] = out / scenario
    return paths


def compare_json(*paths: Path, top: int = 40) -> dict:
    result = run_cli("compare", *paths, "--json", "--top", str(top))
    assert result.code == 0, result.err
    return result.json()


def test_a_run_against_itself_is_the_same_everywhere(runs: dict[str, Path]) -> None:
    result = compare_json(runs["ddp"], runs["ddp"])
    assert [r["label"] for r in result["runs"]] == ["ddp", "ddp #2"]
    assert result["runs"][1]["step_ratio"] == 1.0
    for row in result["phases"] + result["ops"]:
        assert row["ms"][0] == row["ms"][1]
        assert row["ratio"][1] in (1.0, None)
    assert result["highlights"] == []


def test_phases_are_each_runs_own_report(runs: dict[str, Path]) -> None:
    result = compare_json(runs["ddp"], runs["explicit"], runs["slowio"])
    for i, name in enumerate(("ddp", "explicit", "slowio")):
        summary = run_cli("report", runs[name], "--json").json()["summary"]
        assert result["runs"][i]["step_ms"] == summary["step_ms"]
        for row in result["phases"]:
            assert row["ms"][i] == summary["breakdown_ms"][row["phase"]]


def test_what_the_scenarios_were_built_to_show(runs: dict[str, Path]) -> None:
    """explicit exposes its all-reduces, DDP hides part of them, slowio waits on data."""
    result = compare_json(runs["ddp"], runs["explicit"], runs["slowio"])
    ddp, explicit, _ = result["runs"]
    assert explicit["hidden"] == "no" and ddp["hidden"] in ("partly", "yes")
    assert explicit["comm_hidden_fraction"] < ddp["comm_hidden_fraction"]
    phases = {row["phase"]: row for row in result["phases"]}
    assert phases["comm"]["ratio"][1] > 2  # explicit's exposed comm dwarfs ddp's
    assert phases["io"]["ratio"][2] > 10  # slowio's data loading
    # the step ratios agree with the timers of the training loops
    for i, name in ((1, "explicit"), (2, "slowio")):
        expected = timer_means(name)["step_ms"] / timer_means("ddp")["step_ms"]
        assert result["runs"][i]["step_ratio"] == pytest.approx(expected, rel=0.10)
    assert any(h.startswith("slowio's step takes") for h in result["highlights"])


def test_operator_times_agree_with_the_timers(runs: dict[str, Path]) -> None:
    """On CPU runs an operator's time is inclusive: the optimizer step and the data loader's
    next() are regions the training loop also timed."""
    result = compare_json(runs["ddp"], runs["slowio"])
    ops = {row["op"]: row["ms"] for row in result["ops"]}
    for i, name in enumerate(("ddp", "slowio")):
        timers = timer_means(name)
        assert ops["data_loader"][i] == pytest.approx(timers["data_ms"], rel=0.15, abs=0.3)
        assert ops["weights_update"][i] == pytest.approx(timers["optimizer_ms"], rel=0.25, abs=0.3)


def test_gpu_runs_compare_device_time_of_the_same_kernels(runs: dict[str, Path]) -> None:
    """gpu_sync and gpu_async run the same model on one H100 and differ only in host syncs, so
    each layer's device time matches, while the step differs by the host waits."""
    result = compare_json(runs["gpu_sync"], runs["gpu_async"])
    ops = {row["op"]: row for row in result["ops"]}
    for op in ("convolution", "convolution_backward", "batch_norm", "batch_norm_backward"):
        assert ops[op]["ms"][0] > 0
        assert ops[op]["ratio"][1] == pytest.approx(1.0, abs=0.05), op
    step_ratio = timer_means("gpu_async")["step_ms"] / timer_means("gpu_sync")["step_ms"]
    assert result["runs"][1]["step_ratio"] == pytest.approx(step_ratio, rel=0.10)


def test_text_at_80_columns_and_untrusted_labels(runs: dict[str, Path], tmp_path: Path) -> None:
    odd = tmp_path / "[b]x[red] \x1b[31mr"  # no slash: it would make a folder
    shutil.copytree(runs["explicit"], odd)
    result = run_cli("compare", runs["ddp"], odd, env={"COLUMNS": "80"})
    assert result.code == 0, result.err
    assert "\x1b" not in result.out
    assert "[b]x[red]" in result.out  # shown as written, not as markup
    lines = result.out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line.split()}
    assert rows["comm"][0] == "comm" and rows["step"][0] == "step"


def test_needs_two_runs() -> None:
    result = run_cli("compare", PYTORCH / "ddp")
    assert result.code == 2 and "at least two runs" in result.err
    assert len(result.err.strip().splitlines()) == 1


# --- one model, four frameworks -------------------------------------------------------------------

# The same MLP (512-1024-1024-1024-10, batch 128 per worker, SGD), 2 workers, every phase timed
# with the framework synchronized: PyTorch with an explicit gloo all-reduce, TensorFlow with
# MultiWorkerMirroredStrategy's all-reduce called explicitly, MXNet with a dist_sync parameter
# server, Chainer with ChainerMN's multi_node_mean_grad (naive communicator, MPI). Timer names per framework: (data, forward, backward, communication).
FRAMEWORK_RUNS = {
    "pytorch": (SAMPLES / "pytorch" / "explicit", ("data_ms", "forward_ms", "backward_ms", "allreduce_ms")),
    "tensorflow": (SAMPLES / "tensorflow" / "explicit", ("data_ms", "forward_ms", "backward_ms", "allreduce_ms")),
    "mxnet": (SAMPLES / "mxnet" / "mlp", ("data_ms", "forward_ms", "backward_ms", "comm_ms")),
    "chainer": (SAMPLES / "chainer" / "mlp", ("data_ms", "forward_ms", "backward_ms", "allreduce_ms")),
}  # fmt: skip


def _means(folder: Path) -> dict[str, float]:
    truth = json.loads((folder / "groundtruth.json").read_text())
    records = [r for r in truth["records"] if r["profiled"]]
    return {k: statistics.mean(r[k] for r in records) for k in records[0] if k.endswith("_ms")}


def test_frameworks_compare_as_their_timers_do() -> None:
    """PyTorch, TensorFlow, MXNet and Chainer training one model: step and phase ratios against
    PyTorch are the timers' ratios (within 12 %; phases under 2 ms within 0.5 ms of their
    timer), and the operators line up by canonical name."""
    pytest.importorskip(
        "xprof", reason="reading .xplane.pb needs xprof: pip install '.[tensorflow]'"
    )
    folders = [folder for folder, _ in FRAMEWORK_RUNS.values()]
    report = compare_json(*folders)
    assert [r["framework"] for r in report["runs"]] == list(FRAMEWORK_RUNS)
    timers = [(_means(folder), names) for folder, names in FRAMEWORK_RUNS.values()]
    base, base_names = timers[0]
    phases = {row["phase"]: row["ratio"] for row in report["phases"]}
    for index, (means, names) in enumerate(timers[1:], start=1):
        run = report["runs"][index]
        assert run["step_ratio"] == pytest.approx(means["step_ms"] / base["step_ms"], rel=0.12)
        for phase, name, base_name in zip(
            ("io", "forward", "backward", "comm"), names, base_names, strict=True
        ):
            expected = means[name] / base[base_name]
            if min(means[name], base[base_name]) >= 2.0:
                assert phases[phase][index] == pytest.approx(expected, rel=0.12), (
                    run["label"],
                    phase,
                )
            else:  # sub-2 ms phases (data loading): within half a millisecond of the timer
                ms = run["breakdown_ms"][phase]
                assert ms == pytest.approx(means[name], abs=0.5), (run["label"], phase)
        assert run["hidden"] == "no"  # every run waits for its communication
    ops = {row["op"]: row["ms"] for row in report["ops"]}
    for op in ("fully_connected", "fully_connected_backward", "data_loader"):
        assert all(ms and ms > 0 for ms in ops[op]), (op, ops[op])
    assert ops["allreduce"][0] > 0 and ops["allreduce"][1] > 0 and ops["push_pull"][2] > 0
    assert ops["allreduce"][3] > 0  # ChainerMN's multi_node_mean_grad
    # the parameter server's synthetic spans and Python-call regions are not operators
    assert not {"engine backward", "kvstore_round", "step_call"} & set(ops)


def test_ratios_stay_whole_at_80_columns() -> None:
    """The README's three-framework comparison at 80 columns: long run labels and operator
    names give way (ellipsis), never the numbers and ratios."""
    pytest.importorskip(
        "xprof", reason="reading .xplane.pb needs xprof: pip install '.[tensorflow]'"
    )
    folders = [folder for folder, _ in FRAMEWORK_RUNS.values()]
    data = compare_json(*folders, top=15)
    result = run_cli("compare", *folders, env={"COLUMNS": "80"})
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("Per step (ms, exclusive)"))
    tables = lines[start:]
    expected = [
        f"×{ratio:.2f}" if ratio else "absent"
        for row in data["phases"] + data["ops"]
        for value, ratio in zip(row["ms"][1:], row["ratio"][1:], strict=True)
        if value and ratio is not None
    ] + [f"×{run['step_ratio']:.2f}" for run in data["runs"][1:]]
    shown = re.findall(r"×\S*|absent", "\n".join(tables))
    assert sorted(shown) == sorted(expected)
    # every cell after a row's name is whole: a number, a ratio or "-"
    for line in tables:
        words = line.replace("comm hidden", "comm_hidden").split()
        if words and words[0] in {row["phase"] for row in data["phases"]} | {"step", "comm_hidden"}:
            assert all(re.fullmatch(r"[\d,.]+%?|×[\d.]+|-|absent", w) for w in words[1:]), line


def test_runs_whose_names_differ_at_their_end_stay_apart_in_the_text() -> None:
    """Two shared traces' folders, 30 characters long, differ in their last character: cut to
    fit a column, each label keeps its end (issue 34)."""
    root = shared_traces("pytorch")
    a, b = root / "kineto_resnet50_num_workers_0", root / "kineto_resnet50_num_workers_4"
    result = run_cli("compare", a, b)
    assert result.code == 0, result.err
    header = result.out.splitlines()[0]
    assert header.endswith("workers_0"), header
    lines = result.out.splitlines()
    shown = [line.split(":")[0].strip() for line in lines if line.startswith("  kineto")]
    assert shown[0] != shown[1] and shown[0].endswith("_0") and shown[1].endswith("_4"), shown


def test_labels_given_name_the_runs_and_bad_ones_are_one_line() -> None:
    runs = [SAMPLES / "pytorch" / "ddp", SAMPLES / "pytorch" / "explicit"]
    named = run_cli("compare", "--json", *runs, "--label", "before", "--label", "after")
    assert named.code == 0, named.err
    assert [r["label"] for r in named.json()["runs"]] == ["before", "after"]
    for labels, why in ((["one"], "give one per run"), (["same", "same"], "given twice")):
        bad = run_cli("compare", *runs, *[x for label in labels for x in ("--label", label)])
        assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1, bad.err
        assert why in bad.err
