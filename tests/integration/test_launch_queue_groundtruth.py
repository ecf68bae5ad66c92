"""Launch delay split into queueing and launch latency, held to the raw trace JSON (issue 34).

A kernel's launch delay (its runtime call's start to the kernel's start) is *queueing* while
its stream still runs the work launched before it, and *launch latency* from the moment the
stream is free (and the call made) until the kernel starts. The figures are recomputed here
from the raw Kineto JSON of shared traces from other people's runs, kernel by kernel, without
traceview: the launching call by ``args.correlation``, the stream by the kernel's (pid, tid),
the work before it by every kernel, copy and memset on that stream.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import SHARED, run_cli

RESNET = "kineto_resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
MI300 = "tracelens_mi300_resnet_act_checkpoint/resnet_act_checkpoint.json.gz"
NCCL = "hta_nccl_parser_config/nccl_data.json.gz"

_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
_KERNEL = {"kernel", "Kernel"}
_RUNTIME = {"cuda_runtime", "Runtime"}


def launch_truth(path: Path) -> dict[str, Any]:
    """Per kernel launched inside a ProfilerStep (its runtime call starts in one): its delay,
    queueing (until the last earlier work on its stream ended) and launch latency, in µs."""
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")
    )
    calls = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in _RUNTIME and "correlation" in e.get("args", {})
    }
    streams: dict[tuple[Any, Any], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in _DEVICE and e["dur"] > 0:
            streams[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for work in streams.values():
        work.sort()
    delay, queue = [], []
    for e in events:
        call = calls.get(e.get("args", {}).get("correlation"))
        if e.get("cat") not in _KERNEL or call is None:
            continue
        if not any(s <= call["ts"] < t for s, t in steps):
            continue
        # the stream is free once everything that started before this kernel has ended
        earlier = [end for start, end in streams[(e["pid"], e["tid"])] if start < e["ts"]]
        free = min(max(earlier), e["ts"]) if earlier else 0.0
        d = e["ts"] - call["ts"]
        delay.append(d)
        queue.append(min(max(free - call["ts"], 0.0), max(d, 0.0)))
    delay_a, queue_a = np.array(delay), np.array(queue)
    return {
        "kernels": len(delay),
        "delay_p50": float(np.median(delay_a)),
        "queue_p50": float(np.median(queue_a)),
        "latency_p50": float(np.median(delay_a - queue_a)),
        "latency_p95": float(np.quantile(delay_a - queue_a, 0.95)),
        "queued": float(queue_a.sum() / delay_a.sum()),
    }


def _gpu(path: Path) -> dict[str, Any]:
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    (rank,) = result.json()["ranks"]
    return rank["gpu"]


@pytest.mark.parametrize("trace", [RESNET, MI300, NCCL])
def test_launch_delay_split_matches_raw_json(trace: str) -> None:
    """The report's launch latency, queueing and queued share are the raw JSON's."""
    path = SHARED / "pytorch" / trace
    if not path.exists():
        pytest.skip(f"shared trace {path} not present")
    truth = launch_truth(path)
    gpu = _gpu(path)
    assert truth["kernels"] > 100
    # medians over thousands of kernels: the odd kernel at a step's edge moves them by little
    assert gpu["launch_latency_us_p50"] == pytest.approx(truth["latency_p50"], abs=1.0)
    assert gpu["launch_latency_us_p95"] == pytest.approx(truth["latency_p95"], rel=0.1, abs=2.0)
    assert gpu["launch_queue_us_p50"] == pytest.approx(truth["queue_p50"], rel=0.05, abs=2.0)
    assert gpu["launch_queued_fraction"] == pytest.approx(truth["queued"], abs=0.02)


def test_healthy_resnet_delay_is_queueing_not_launch_latency() -> None:
    """The ResNet-50 trace's kernels wait milliseconds after their launch call, behind a deep
    queue of earlier kernels: the report calls that queueing, and its launch latency is the
    few µs the stream stood idle (issue 34: 'launch latency 9.76 ms' was queueing)."""
    path = SHARED / "pytorch" / RESNET
    if not path.exists():
        pytest.skip(f"shared trace {path} not present")
    truth = launch_truth(path)
    assert truth["delay_p50"] > 5_000 and truth["latency_p50"] < 10  # what the trace holds
    gpu = _gpu(path)
    assert gpu["launch_latency_us_p50"] < 10
    assert gpu["launch_queued_fraction"] > 0.95
    text = run_cli("report", path)
    assert text.code == 0, text.err
    assert "queueing" in text.out and "queued" in text.out
