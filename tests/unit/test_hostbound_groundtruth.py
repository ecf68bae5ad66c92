"""Host-bound time on GPU timelines (issue 17) against an independent reading of the raw traces.

``kineto_truth`` reads a Kineto JSON trace with ``json`` alone (no traceview code) and cuts one
step the way the issue defines it: the device-busy union of kernels, copies and memsets; the
device's time per phase (a kernel takes the phase of the host call that launched it, found by
``correlation``); and in the device's gaps, what the host does: the training thread inside a
top-level operator or region of h2d, forward, backward or update (or between two of one phase),
or PyTorch's autograd thread inside an operator (backward), is that phase's host-bound time;
the training thread loading data is data (io); a synchronize at the top of the loop, outside
every operator, is the host waiting, not launching: idle. The steps and gpu tables of the same
trace must agree to the nanosecond's rounding.

The top-level operators' phases are read the way a person reads this loop: the DataLoader
region is io, ``Optimizer.step`` update, ``Optimizer.zero_grad`` other, an operator whose only
device work is host-to-device copies h2d, the gradient seed ``ones_like`` backward, the
operators before it forward.

Also hostile GPU traces (hand-made, timings in µs chosen so every figure is known): no runtime
calls, kernels without a correlation, a step without kernels, no host thread at all, a kernel
that runs past its step's end.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from tests.conftest import SAMPLES, analysed
from traceview.model import schema as S
from traceview.runs import ingest_run
from traceview.store import rundir as R

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
_DEVICE_ORDER = ("forward", "backward", "update", "h2d", "io", "comm", "other")
#: the host's collective calls in the shared traces (communication on a host thread)
_HOST_COMM = ("nccl:all_reduce", "c10d::allreduce_", "record_param_comms")
_BOUND_ORDER = ("h2d", "forward", "backward", "update")  # the host-bound levels, highest first


def _union(intervals: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    if not intervals:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    intervals = sorted(intervals)
    out = [list(intervals[0])]
    for s, e in intervals[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    arr = np.array(out, np.int64)
    return arr[:, 0], arr[:, 1]


def _inside(intervals: list[tuple[int, int]], at: np.ndarray) -> np.ndarray:
    s, e = _union(intervals)
    if len(s) == 0:
        return np.zeros(len(at), bool)
    pos = np.searchsorted(s, at, side="right") - 1
    return (pos >= 0) & (at < e[np.maximum(pos, 0)])


def _is_h2d_copy(e: dict[str, Any]) -> bool:
    return e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]


def kineto_truth(trace: dict[str, Any], step_name: str) -> dict[str, int]:
    """One step of a single-rank PyTorch Kineto trace, cut by hand (ns): window, device time
    per phase, host-bound time per phase, data (io) and what is left idle."""
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    for e in ev:
        e["s"] = round(float(e["ts"]) * 1000)
        e["e"] = e["s"] + round(float(e["dur"]) * 1000)
    marker = next(e for e in ev if e["name"] == step_name)
    training = (marker["pid"], marker["tid"])
    runtime = {
        e["args"]["correlation"]: e
        for e in ev
        if e.get("cat") in _RUNTIME_CATS and "correlation" in e.get("args", {})
    }
    device = [e for e in ev if e.get("cat") in _DEVICE_CATS]

    def launcher(k: dict[str, Any]) -> dict[str, Any] | None:
        return runtime.get(k.get("args", {}).get("correlation"))

    # the window: the marker, up to the end of the last device activity launched inside it
    w0, w1 = marker["s"], marker["e"]
    for k in device:
        r = launcher(k)
        if r is not None and w0 <= r["s"] < marker["e"]:
            w1 = max(w1, k["e"])

    host = [e for e in ev if e.get("cat") in _HOST_CATS and e is not marker]
    on_training = sorted(
        (e for e in host if (e["pid"], e["tid"]) == training and e["e"] > w0 and e["s"] < w1),
        key=lambda e: (e["s"], -(e["e"] - e["s"])),
    )
    top: list[dict[str, Any]] = []
    for e in on_training:
        if not top or e["s"] >= top[-1]["e"]:
            top.append(e)

    def launched_under(h: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            k
            for k in device
            if (r := launcher(k)) is not None
            and (r["pid"], r["tid"]) == training
            and h["s"] <= r["s"] < h["e"]
        ]

    ops = [h for h in top if h.get("cat") not in _RUNTIME_CATS]
    phase: dict[int, str] = {}
    seen_backward = False
    for h in ops:
        name, under = h["name"], launched_under(h)
        if name.startswith("enumerate(DataLoader)"):
            p = "io"
        elif name.startswith("Optimizer.step"):
            p = "update"
        elif name.startswith("Optimizer.zero_grad"):
            p = "other"
        elif under and all(_is_h2d_copy(k) for k in under):
            p = "h2d"
        elif name == "aten::ones_like" or name.startswith("autograd::"):
            p = "backward"
        else:
            p = "other" if seen_backward else "forward"
        seen_backward |= p == "backward"
        phase[id(h)] = p
    others = {
        (e["pid"], e["tid"])
        for e in host
        if (e["pid"], e["tid"]) != training and e.get("cat") == "cpu_op"
        and e["e"] > w0 and e["s"] < w1
    }  # fmt: skip
    autograd_ops = [e for e in host if (e["pid"], e["tid"]) in others and e.get("cat") == "cpu_op"]

    def device_phase(k: dict[str, Any]) -> str:
        if _is_h2d_copy(k):
            return "h2d"
        if "nccl" in k["name"].lower():
            return "comm"
        r = launcher(k)
        if r is None:
            return "other"
        if (r["pid"], r["tid"]) != training:
            return "backward"  # launched by the autograd thread
        h = next((h for h in ops if h["s"] <= r["s"] < h["e"]), None)
        return "other" if h is None or phase[id(h)] == "io" else phase[id(h)]

    pieces = [(max(k["s"], w0), min(k["e"], w1), device_phase(k)) for k in device]
    pieces = [p for p in pieces if p[1] > p[0]]
    bounds = {w0, w1}
    for s, e, _ in pieces:
        bounds |= {s, e}
    for h in [*on_training, *autograd_ops]:
        bounds |= {min(max(h["s"], w0), w1), min(max(h["e"], w0), w1)}
    b = np.array(sorted(bounds), np.int64)
    lo, hi = b[:-1], b[1:]
    at, length = lo + (hi - lo) // 2, hi - lo

    # the training thread's phase at each instant: its top-level operator, or between two of
    # one phase (fill); a synchronize outside every operator is nobody's
    state = np.full(len(at), "", object)
    for h in ops:
        state[_inside([(h["s"], h["e"])], at)] = phase[id(h)]
    for a, c in itertools.pairwise(ops):
        if phase[id(a)] == phase[id(c)] != "other":
            state[_inside([(a["e"], c["s"])], at)] = phase[id(a)]
    # the attribution rule's order: the device's compute and copies, data loading, then
    # communication (device or any host thread), the device's other work, host-bound levels
    truth: dict[str, int] = {"wall": w1 - w0}
    claimed = np.zeros(len(at), bool)
    host_comm = [(e["s"], e["e"]) for e in host if e["name"] in _HOST_COMM]
    for p in (*_DEVICE_ORDER[:4], "io", "comm", "other"):
        mine = _inside([(s, e) for s, e, q in pieces if q == p], at)
        if p == "io":
            mine = state == "io"
        elif p == "comm":
            truth["comm_total"] = int(length[mine | _inside(host_comm, at)].sum())
            mine = mine | _inside(host_comm, at)
        mine &= ~claimed
        truth[p if p in ("io", "comm") else f"device_{p}"] = int(length[mine].sum())
        claimed |= mine
    in_autograd = _inside([(e["s"], e["e"]) for e in autograd_ops], at)
    for p in _BOUND_ORDER:
        mine = ~claimed & ((state == p) | (in_autograd & (p == "backward")))
        truth[f"host_bound_{p}"] = int(length[mine].sum())
        claimed |= mine
    truth["unclaimed"] = int(length[~claimed].sum())
    return truth


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _tables(run: Path) -> pl.DataFrame:
    steps = pl.from_arrow(analysed(run).steps)
    gpu = pl.from_arrow(R.read_table(run / "gpu.parquet", S.GPU_SCHEMA))
    assert isinstance(steps, pl.DataFrame) and isinstance(gpu, pl.DataFrame)
    return steps.join(gpu, on=[S.RANK, S.STEP], suffix="_gpu")


def _check_step(row: dict[str, Any], truth: dict[str, int], tolerance_ns: int) -> None:
    assert row[S.WALL_NS] == pytest.approx(truth["wall"], abs=tolerance_ns)
    for p in ("h2d", "forward", "backward", "update"):
        assert row[S.device_ns(p)] == pytest.approx(truth[f"device_{p}"], abs=tolerance_ns), p
        assert row[S.host_bound_ns(p)] == pytest.approx(
            truth[f"host_bound_{p}"], abs=tolerance_ns
        ), p
        total = truth[f"device_{p}"] + truth[f"host_bound_{p}"]
        assert row[S.phase_ns(p)] == pytest.approx(total, abs=tolerance_ns), p
    assert row[S.phase_ns(S.IO)] == pytest.approx(truth["io"], abs=tolerance_ns)


def test_gpu_sync_agrees_with_an_independent_cut_of_the_raw_trace(tmp_path: Path) -> None:
    """Every profiled step of sample_traces/pytorch/gpu_sync: device time and host-bound time
    per phase as read off the raw JSON. The loop's own ``torch.cuda.synchronize()`` calls sit
    at the top of the loop, outside every operator (after the DataLoader, after the copies,
    after the loss): the device's wait for them is nobody's phase (gpu.py: "a synchronize
    outside any phase: other"); the previous code billed them, and the Python around them, to
    forward by position (0.21 to 0.26 ms per step)."""
    folder = SAMPLES / "pytorch" / "gpu_sync"
    trace = _load(folder / "rank-0.pt.trace.json.gz")
    table = _tables(ingest_run([folder], tmp_path / "run"))
    assert table.height == 5
    for row in table.iter_rows(named=True):
        truth = kineto_truth(trace, f"ProfilerStep#{row[S.STEP]}")
        _check_step(row, truth, tolerance_ns=2)
