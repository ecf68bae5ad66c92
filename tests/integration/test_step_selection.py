"""Which steps the report counts, and where steps are when the trace marks none, held to figures
computed here from the raw trace JSON (json.load and a few lines; never the program's own
output): the ProfilerStep windows and their warm-up, the data loader's and the optimizer's calls
of traces without markers, the time before the first step (startup).

Traces: the shared folder's (other people's runs, ../shared/traces; skipped where absent)."""

from __future__ import annotations

import gzip
import itertools
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli, shared_traces

ACT_CHECKPOINT = "pytorch/tracelens_mi300_resnet_act_checkpoint"
WORKERS_4 = "pytorch/kineto_resnet50_num_workers_4"
AUTOGRAD_API = "pytorch/kineto_resnet50_autograd_api_num_workers_0"
DDP_RESNET18 = "pytorch/tracelens_mi300_ddp_resnet18"

#: Host categories in old and new Kineto traces (not kernels, copies, flows).
HOST_CATS = {"Operator", "Runtime", "cpu_op", "cuda_runtime", "user_annotation", "python_function"}


def _events(folder: str) -> list[dict[str, Any]]:
    (path,) = sorted(shared_traces(folder).glob("*.json.gz"))
    trace = json.loads(gzip.decompress(path.read_bytes()))
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def _report(*args: str | Path) -> dict[str, Any]:
    result = run_cli("report", "--json", *args)
    assert result.code == 0, result.err
    return result.json()


def _profiler_steps(events: list[dict[str, Any]]) -> dict[int, float]:
    """Step windows (ms) by N, as the trace defines them on a GPU run: the host's
    ProfilerStep#N marker, extended to the end of the last device activity launched inside it
    (runtime call and activity share ``args.correlation``); a window starts no earlier than the
    previous one ended."""
    markers = sorted(
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
        for e in events
        if re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))
        and e.get("ph") == "X"
        and e.get("cat") in HOST_CATS
    )
    return _gpu_windows(events, markers)


def _gpu_windows(
    events: list[dict[str, Any]], markers: list[tuple[float, float, int]]
) -> dict[int, float]:
    """Host windows (start, end, number; µs) as a GPU run's steps: each extended to the end of
    the device activities launched inside it, starting no earlier than the previous ended."""
    device_end: dict[int, float] = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("ph") == "X" and corr is not None and e.get("cat") not in HOST_CATS:
            device_end[corr] = max(device_end.get(corr, 0.0), e["ts"] + e["dur"])
    launched: dict[int, float] = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in ("Runtime", "cuda_runtime") and corr in device_end:
            for start, end, n in markers:
                if start <= e["ts"] < end:
                    launched[n] = max(launched.get(n, 0.0), device_end[corr])
    out, previous = {}, float("-inf")
    for start, end, n in markers:
        start = max(start, previous)
        previous = max(end, launched.get(n, end))
        out[n] = (previous - start) / 1e3
    return out


def _warmup(steps: dict[int, float]) -> list[int]:
    """Leading steps above 1.3x the median of the steps after each, while two steps at least
    remain (the rule, restated)."""
    numbers, out = sorted(steps), []
    for i, n in enumerate(numbers[:-2]):
        if steps[n] <= 1.3 * statistics.median(steps[m] for m in numbers[i + 1 :]):
            break
        out.append(n)
    return out


@pytest.mark.parametrize("folder", [ACT_CHECKPOINT, WORKERS_4])
def test_warm_up_steps_are_left_out_of_the_headline(folder: str) -> None:
    """The headline step is the mean of the ProfilerStep windows after the leading warm-up ones
    (ROCm ResNet: 49.06 ms, then 18.98 and 18.55; ResNet-50 num_workers=4: 182 ms, then
    123-163); each step stays in per_step, the warm-up one excluded and named."""
    steps = _profiler_steps(_events(folder))
    warm = _warmup(steps)
    assert warm == [min(steps)], f"the trace's first step is its warm-up: {steps}"
    counted = [ms for n, ms in steps.items() if n not in warm]
    report = _report(shared_traces(folder))
    assert report["summary"]["step_ms"] == pytest.approx(statistics.fmean(counted), abs=0.01)
    assert report["run"]["steps_from"] == "markers"
    assert report["run"]["steps"] == len(steps)
    per_step = {s["step"]: s for s in report["per_step"]}
    assert sorted(per_step) == sorted(steps), "every step is kept in per_step"
    for n, ms in steps.items():
        assert per_step[n]["step_ms"] == pytest.approx(ms, abs=0.01)
        assert per_step[n]["excluded"] == ("warm-up" if n in warm else None)
    assert per_step[warm[0]]["excluded_reason"]
    said = f"step {warm[0]} left out as warm-up: {steps[warm[0]]:,.1f} ms against a median of"
    assert any(said in r for r in report["remarks"]), report["remarks"]
    # the breakdown is of the same steps: its phases sum to the headline step
    breakdown = report["summary"]["breakdown_ms"]
    assert sum(breakdown.values()) == pytest.approx(report["summary"]["step_ms"], abs=0.02)
    assert report["step_stats"]["count"] == len(counted)


def test_later_outliers_are_named_and_kept() -> None:
    """ResNet-50 num_workers=4: a later step well above the median (1.25x) is kept in the
    figures and named."""
    steps = _profiler_steps(_events(WORKERS_4))
    warm = _warmup(steps)
    counted = {n: ms for n, ms in steps.items() if n not in warm}
    median = statistics.median(counted.values())
    slow = [n for n, ms in counted.items() if ms > 1.25 * median]
    assert slow, "the trace has a slow later step"
    report = _report(shared_traces(WORKERS_4))
    per_step = {s["step"]: s for s in report["per_step"]}
    assert all(per_step[n]["mark"] == "slow" and per_step[n]["excluded"] is None for n in slow)
    assert any(f"step {slow[0]} (" in r and "kept" in r for r in report["remarks"])


def test_steps_and_skip_choose_the_steps_in_the_traces_numbers() -> None:
    steps = _profiler_steps(_events(ACT_CHECKPOINT))
    first, last = min(steps), max(steps)
    path = shared_traces(ACT_CHECKPOINT)
    everything = _report(path, "--skip", "0")
    assert everything["summary"]["step_ms"] == pytest.approx(
        statistics.fmean(steps.values()), abs=0.01
    )
    assert all(s["excluded"] is None for s in everything["per_step"])
    one = _report(path, "--steps", f"{last}-{last}")
    assert one["summary"]["step_ms"] == pytest.approx(steps[last], abs=0.01)
    assert one["run"]["step_choice"] == f"--steps {last}-{last}"
    assert {s["step"] for s in one["per_step"] if s["excluded"] == "selection"} == set(steps) - {
        last
    }
    skipped = _report(path, "--steps", f"{first}-{last}", "--skip", "2")
    assert skipped["summary"]["step_ms"] == pytest.approx(steps[last], abs=0.01)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--steps", "1-3"], "no step in that range (its steps are"),
        (["--steps", "9-2"], "ends before it starts"),
        (["--steps", "a-b"], "give a step number or a range"),
        (["--skip", "3"], "leaves no step"),
        (["--skip", "-1"], "0 or more"),
    ],
)
def test_a_step_choice_outside_the_run_is_one_line_and_exit_2(args: list[str], said: str) -> None:
    result = run_cli("report", shared_traces(ACT_CHECKPOINT), *args)
    assert result.code == 2, result.err
    assert said in result.err and "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err


def test_a_run_directory_serves_each_choice_without_mixing(tmp_path: Path) -> None:
    """The analysis cached in a run directory holds every step: reports with different choices,
    one after another on the same directory, each count their own steps."""
    steps = _profiler_steps(_events(ACT_CHECKPOINT))
    run = tmp_path / "run"
    assert run_cli("ingest", shared_traces(ACT_CHECKPOINT), "-o", run).code == 0
    last = max(steps)
    warm = _warmup(steps)
    expected = [
        ([], statistics.fmean(ms for n, ms in steps.items() if n not in warm)),
        (["--steps", str(last)], steps[last]),
        (["--skip", "0"], statistics.fmean(steps.values())),
        ([], statistics.fmean(ms for n, ms in steps.items() if n not in warm)),
    ]
    for args, step_ms in expected:
        assert _report(run, *args)["summary"]["step_ms"] == pytest.approx(step_ms, abs=0.01)


def test_export_marks_the_steps_the_report_leaves_out(tmp_path: Path) -> None:
    import polars as pl

    steps = _profiler_steps(_events(ACT_CHECKPOINT))
    run = tmp_path / "run"
    assert run_cli("ingest", shared_traces(ACT_CHECKPOINT), "-o", run).code == 0
    assert run_cli("export", run, "-o", tmp_path / "out").code == 0
    table = pl.read_parquet(tmp_path / "out" / "steps.parquet")
    marked = dict(zip(table["step"].to_list(), table["excluded"].to_list(), strict=True))
    assert marked == {n: ("warm-up" if n in _warmup(steps) else None) for n in steps}
    assert run_cli("export", run, "-o", tmp_path / "two", "--steps", str(max(steps))).code == 0
    table = pl.read_parquet(tmp_path / "two" / "steps.parquet")
    assert table.filter(pl.col("excluded").is_null())["step"].to_list() == [max(steps)]
    # the Chrome trace holds every event: a choice there is refused, not ignored
    chrome = run_cli("export", run, "--format", "chrome", "--skip", "1")
    assert chrome.code == 2 and len(chrome.err.strip().splitlines()) == 1, chrome.err


# --- traces without step markers ----------------------------------------------------------------


def _first_host_us(events: list[dict[str, Any]]) -> float:
    """The first host call (not the profiler's own "Trace" window)."""
    return min(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS)


def test_markerless_steps_from_the_data_loader() -> None:
    """ResNet-50 profiled with the old autograd API (no ProfilerStep): a step from one
    DataLoader __next__ call to the next, the last to the end of the last optimizer step; what
    comes before the first is startup. Today's headline was one multi-second window."""
    events = _events(AUTOGRAD_API)
    calls = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if "DataLoader" in e.get("name", "") and "__next__" in e.get("name", "")
    )
    optimizer = sorted(
        e["ts"] + e["dur"] for e in events if e.get("name", "").startswith("Optimizer.step#")
    )
    assert len(calls) == 6 and len(optimizer) == 6
    starts = [s for s, _ in calls]
    ends = [*starts[1:], optimizer[-1]]
    windows = _gpu_windows(events, list(zip(starts, ends, range(len(starts)), strict=True)))
    expected = [windows[i] for i in range(len(starts))]
    report = _report(shared_traces(AUTOGRAD_API))
    assert report["run"]["steps_from"] == "dataloader"
    got = [s["step_ms"] for s in report["per_step"]]
    assert got == pytest.approx(expected, abs=0.01)
    warm = _warmup(dict(enumerate(expected)))
    assert warm == [0], "the first window holds cuDNN autotuning and lazy initialization"
    counted = [ms for i, ms in enumerate(expected) if i not in warm]
    assert report["summary"]["step_ms"] == pytest.approx(statistics.fmean(counted), abs=0.01)
    assert report["summary"]["step_ms"] < 200, "not the multi-second window of before"
    startup = (starts[0] - _first_host_us(events)) / 1e3
    assert report["summary"]["startup_ms"] == pytest.approx(startup, abs=0.01)
    assert any("inferred, from one data-loader __next__" in r for r in report["remarks"])


def test_markerless_steps_from_the_optimizer() -> None:
    """ROCm "DDP ResNet-18" (no ProfilerStep, no data loader in the trace): each step ends where
    an Optimizer.step annotation ends; the first starts at the loop's first call."""
    events = _events(DDP_RESNET18)
    ends = sorted(
        e["ts"] + e["dur"]
        for e in events
        if e.get("name", "").startswith("Optimizer.step#") and e.get("cat") == "user_annotation"
    )
    assert len(ends) == 5
    pairs = itertools.pairwise(ends)
    windows = _gpu_windows(events, [(a, b, i) for i, (a, b) in enumerate(pairs)])
    between = [windows[i] for i in range(4)]
    report = _report(shared_traces(DDP_RESNET18))
    assert report["run"]["steps_from"] == "optimizer"
    got = [s["step_ms"] for s in report["per_step"]]
    assert len(got) == 5
    assert got[1:] == pytest.approx(between, abs=0.01)
    assert report["summary"]["step_ms"] < 1200, "not the 3.4 s window of before"


def test_with_nothing_that_repeats_the_report_says_one_window(tmp_path: Path) -> None:
    """A trace with no markers and no loop calls that repeat: one window, said so, with no
    per-step (GPU) advice built on its one-time costs and no startup figure."""
    source = REPO / "sample_traces" / "pytorch" / "gpu_async" / "rank-0.pt.trace.json.gz"
    trace = json.loads(gzip.decompress(source.read_bytes()))
    trace["traceEvents"] = [
        e
        for e in trace["traceEvents"]
        if not str(e.get("name", "")).startswith(
            ("ProfilerStep#", "Optimizer.", "enumerate(DataLoader)")
        )
        and e.get("cat") != "user_annotation"
    ]
    path = tmp_path / "bare.pt.trace.json"
    path.write_text(json.dumps(trace))
    report = _report(path)
    assert report["run"]["steps_from"] == "one_window"
    assert report["run"]["steps"] == 0
    assert report["summary"]["startup_ms"] is None
    assert report["gpu_verdict"] is None
    text = run_cli("report", path)
    assert text.code == 0 and "(one window)" in text.out and "one window, no steps" in text.out
    chosen = run_cli("report", path, "--steps", "1-2")
    assert chosen.code == 2 and "no numbered steps" in chosen.err


def test_inferred_steps_that_disagree_across_ranks_are_said(tmp_path: Path) -> None:
    """Two ranks of a markerless trace, one of which lost its last optimizer steps: one warning
    line names both counts, and only the steps both ranks have are counted (the rest listed as
    incomplete); nothing raised."""
    (source,) = sorted(shared_traces("pytorch/hta_gpu_user_annotation").glob("*.json.gz"))
    trace = json.loads(gzip.decompress(source.read_bytes()))
    steps = sorted(
        e["ts"] for e in trace["traceEvents"] if e.get("name", "").startswith("Optimizer.step#")
    )
    for rank in (0, 1):
        trace["distributedInfo"] = {"rank": rank, "world_size": 2}
        if rank == 1:  # its last optimizer step (host and device annotation) left out
            trace["traceEvents"] = [
                e
                for e in trace["traceEvents"]
                if not (e.get("name", "").startswith("Optimizer.step#") and e["ts"] >= steps[-4])
            ]
        (tmp_path / f"rank-{rank}.pt.trace.json").write_text(json.dumps(trace))
    result = run_cli(
        "report", "--json", tmp_path / "rank-0.pt.trace.json", tmp_path / "rank-1.pt.trace.json"
    )
    assert result.code == 0, result.err
    report = result.json()
    said = [w for w in report["warnings"] if "inferred steps disagree across ranks" in w]
    assert len(said) == 1 and "rank 1: " in said[0] and "rank 0: " in said[0], report["warnings"]
    assert report["incomplete_steps"], "the steps rank 1 lacks are listed apart"


def test_the_tui_counts_the_steps_chosen() -> None:
    """tui --steps: the app opens the run with the choice, its overview shows that headline;
    a choice outside the run ends the app with the one-line usage error (exit 2)."""
    import asyncio

    from tests.tui_helpers import loaded
    from traceview.model.choice import StepChoice
    from traceview.model.errors import UsageError
    from traceview.tui.app import TraceviewApp

    steps = _profiler_steps(_events(ACT_CHECKPOINT))
    last = max(steps)

    def open_app(choice: StepChoice) -> TraceviewApp:
        app = TraceviewApp(groups=[[shared_traces(ACT_CHECKPOINT)]], choice=choice)
        app.animation_level = "none"

        async def main() -> None:
            async with app.run_test(size=(80, 24)) as pilot:
                await app.ready.wait()
                if app.error is None:  # (a failed open ends the app itself)
                    await loaded(pilot)

        asyncio.run(main())
        app.close_runs()
        return app

    app = open_app(StepChoice(last, last))
    assert app.error is None
    assert app.views[0].report.summary.step_ms == pytest.approx(steps[last], abs=0.01)
    app = open_app(StepChoice(1, 2))
    assert isinstance(app.error, UsageError) and app.return_code == 2
    assert "no step in that range" in str(app.error)


ALEXNET = "pytorch/hta_critical_path_alexnet"


def test_a_benchmark_that_names_its_warm_up_and_measured_iterations() -> None:
    """Holistic Trace Analysis's AlexNet critical-path input (facebookresearch/
    HolisticTraceAnalysis tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_
    trace.json.gz; not in the shared folder yet: skipped until it is placed at ALEXNET): no
    ProfilerStep, a PARAM benchmark whose "...|warmup|forward" and "...|measure|forward"
    annotations are its two iterations. Before them, 29.9 s of CUDA context creation
    (aten::to -> empty_strided) is startup; the warm-up iteration (10.8 s of first cuDNN
    convolution) is left out as the trace names it; the headline is the measured iteration,
    not an "h2d bottleneck" of one-time costs."""
    events = _events(ALEXNET)
    iterations = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("cat") == "user_annotation"
        and e["name"].endswith(("|warmup|forward]", "|measure|forward]"))
    )
    outer = []  # the outermost of each (an annotation of the same name nests inside)
    for start, end, name in iterations:
        if not outer or start >= outer[-1][1]:
            outer.append((start, end, name))
    assert [n.split("|")[-2] for _, _, n in outer] == ["warmup", "measure"]
    windows = _gpu_windows(events, [(s, e, i) for i, (s, e, _) in enumerate(outer)])
    report = _report(shared_traces(ALEXNET))
    assert report["run"]["steps_from"] == "annotations"
    assert [s["excluded"] for s in report["per_step"]] == ["warm-up", None]
    assert report["summary"]["step_ms"] == pytest.approx(windows[1], abs=0.01)
    startup = (outer[0][0] - _first_host_us(events)) / 1e3
    assert report["summary"]["startup_ms"] == pytest.approx(startup, abs=0.01)
    assert startup > 29_900, "the CUDA context creation is in the startup"
    assert report["summary"]["bottleneck"] != "h2d"
