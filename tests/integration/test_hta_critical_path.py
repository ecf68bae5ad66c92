"""The critical path of a single-rank GPU trace, held to Holistic Trace Analysis's own (issue 33).

HTA (pip install HolisticTraceAnalysis) computes a critical path on one rank; tests/hta_critical_path.py
runs it and says what its path holds. The two agree in definition only where HTA's path spans the
step with no gap: HTA links consecutive top-level operators of a thread with zero-weight edges
(a thread's idle time counts nothing) and sets the path's span by its heaviest chain, while
traceview's job step spans the step's window. On a GPU-bound step in steady state both come down
to the chain of the step's kernels back to back. The shared traces where that holds (HTA's total
equals its path's span and the step's duration, within 2%; checked below):

- pytorch/hta_ns_resolution (ResNet-like training on a V100, ranks 0 of 1, ProfilerStep#101-105):
  step 103, HTA 95.57 ms, 93.5 of kernels and 2.0 of gaps between kernels.

The others do not qualify (hta 0.5.0 under pandas 3, middle ProfilerStep): HTA's path is the CPU
thread's busy time, or holds gaps, under the step's duration: hta_nccl_parser_config (101 of 220 ms),
hta_df_index_resolver (239 of 346), hta_amd_mi250 (7.4 of 9.3), hta_trace_diff_test (115 of 166),
hta_trace_diff_control (60 of 76), hta_sampled_2rank (268 of 607 and 273 of 608); hta_cpu_only_gloo:
no GPU (HTA finds no path); kineto_resnet50_num_workers_0/4: HTA fails (a memcpy without its runtime
call), tracelens_mi300_resnet_act_checkpoint: HTA fails (an int16 index); hta_gpu_user_annotation,
param_resnet, param_linear, kineto_resnet50_autograd_api, tracelens_mi300_ddp_resnet18: no
ProfilerStep.

Ops: HTA names a path edge by its event (a kernel, a CPU operator); traceview by its canonical
operator. Each HTA edge is named here as traceview's own events name that event (the kernel's
correlation id, the CPU operator's name), so that the comparison is of paths, not of naming.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import SHARED, needs_module, run_cli

pytestmark = needs_module("hta", "pip install HolisticTraceAnalysis")

# (trace under the shared folder, ProfilerStep#N)
QUALIFYING = [
    ("pytorch/hta_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 103),
]


def _trace(relative: str) -> Path:
    path = SHARED / relative
    if not path.exists():
        pytest.skip(
            f"shared trace not found at {path} (the shared traces live beside the repository)"
        )
    return path


def _traceview_names(trace: Path) -> tuple[dict[int, str], dict[str, str]]:
    """How traceview's events name each event: kernel correlation id -> op, CPU name -> op."""
    from traceview.runs import open_run

    with open_run([trace]) as run:
        events = pl.from_arrow(run.events())
    assert isinstance(events, pl.DataFrame)
    events = events.with_columns(pl.col("name", "op", "device").cast(pl.Utf8))
    kernels = events.filter(pl.col("device") == "gpu", pl.col("correlation").is_not_null())
    by_corr = dict(zip(kernels["correlation"].to_list(), kernels["op"].to_list(), strict=True))
    cpu = (
        events.filter(pl.col("device") == "cpu", pl.col("op").is_not_null())
        .group_by("name")
        .agg(pl.col("op").mode().first())
    )
    return by_corr, dict(zip(cpu["name"].to_list(), cpu["op"].to_list(), strict=True))


def _top(per_op: dict[str, float], n: int = 3) -> list[str]:
    return [op for op, _ in sorted(per_op.items(), key=lambda kv: -kv[1])[:n]]


@pytest.mark.parametrize(("relative", "step"), QUALIFYING)
def test_critical_path_agrees_with_hta(relative: str, step: int) -> None:
    """Same total within 2% and the same three operators on top of the path (time per op)."""
    from tests.hta_critical_path import hta_critical_path

    trace = _trace(relative)
    hta = hta_critical_path(trace, step)
    span = hta["path_end_ms"] - hta["path_start_ms"]
    # where HTA's own path spans its step, its definition and traceview's coincide
    assert hta["total_ms"] == pytest.approx(span, rel=0.02), hta["total_ms"]
    result = run_cli("report", trace, "--json", "--steps", f"{step}-{step}")
    assert result.code == 0, result.err
    report: dict[str, Any] = json.loads(result.out)
    path = report["critical_path"]
    print(
        f"{trace.name} step {step}: HTA {hta['total_ms']:.2f} ms, traceview {path['step_ms']:.2f} ms"
    )
    assert path["step_ms"] == pytest.approx(hta["total_ms"], rel=0.02)
    by_corr, by_name = _traceview_names(trace)
    theirs: dict[str, float] = defaultdict(float)
    for edge in hta["path"]:
        if edge["kind"] == "kernel" and edge["correlation"] is not None:
            theirs[by_corr.get(edge["correlation"], edge["name"])] += edge["ms"]
        elif edge["kind"] == "cpu_op":
            theirs[by_name.get(edge["name"], edge["name"])] += edge["ms"]
    # the path's time per operator (by_op: every piece of the path, not the report's list of
    # stretches, which joins a rank's pieces of one phase under the longest one's operator)
    ours: dict[str, float] = defaultdict(float)
    for entry in path["by_op"]:
        if entry["kind"] in ("kernel", "compute", "host_bound"):
            ours[entry["op"]] += entry["ms"]
    print(f"top ops: HTA {_top(theirs, 5)}, traceview {_top(ours, 5)}")
    assert set(_top(ours)) == set(_top(theirs)), (dict(theirs), dict(ours))
