"""Make small, real PyTorch profiler traces of a single-GPU run with memory records
(profile_memory=True), with the CUDA caching allocator's own per-step figures as the truth.

Usage:

    python sample_traces/pytorch/make_gpu_memory_traces.py SCENARIO OUTDIR [--device cuda|cpu]
        [--no-profiler --iters N]

SCENARIO is one of:
  gpu_memory  an EXTRA_MIB MiB tensor is allocated on the GPU in forward and held to the end of
              backward; the gradients (set to None at the end of every step) are allocated in
              backward while it is held, so every step peaks in backward.
  gpu_leak    every step appends a LEAK_MIB MiB GPU tensor to a list in forward and never frees it.

One process, no process group. Each profiled step resets the allocator's peak statistics at its
start and reads them at its end (torch.cuda.max_memory_allocated / memory_allocated /
max_memory_reserved): OUTDIR/groundtruth.json holds them per step beside the known sizes, and
OUTDIR/rank-0.pt.trace.json.gz is the profiler's trace. With --device cpu (to try the script
without a GPU) the trace holds CPU records only and the per-step figures are null.

With --no-profiler the script starts no profiler and writes only groundtruth.json: that is the
job `traceview collect` wraps, whose own profiler records the steps (--iters: enough iterations
for collect's skip, warm-up and recorded steps). Every iteration is also timed
(time.perf_counter between two torch.cuda.synchronize calls: step_ms).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

SCENARIOS = ("gpu_memory", "gpu_leak")
DIMS = (4096, 4096, 4096, 10)
BATCH = 256
EXTRA_MIB = 256
LEAK_MIB = 2
WAIT, WARMUP, ACTIVE = 1, 1, 5
ITERS = WAIT + WARMUP + ACTIVE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--no-profiler", dest="profiler", action="store_false")
    parser.add_argument("--iters", type=int, default=ITERS)
    args = parser.parse_args()
    iters = args.iters if not args.profiler else ITERS
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    args.outdir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for width_in, width_out in itertools.pairwise(DIMS):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = torch.randn(iters, BATCH, DIMS[0], device=device)
    ys = torch.randint(0, DIMS[-1], (iters, BATCH), device=device)
    extra_bytes = EXTRA_MIB << 20 if args.scenario == "gpu_memory" else 0
    leak_bytes = LEAK_MIB << 20 if args.scenario == "gpu_leak" else 0
    leaked: list[torch.Tensor] = []
    steps: dict[str, dict[str, int | None]] = {}

    trace_json = args.outdir / "rank-0.pt.trace.json"

    def on_ready(p: profile) -> None:
        p.export_chrome_trace(str(trace_json))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    profiler = (
        profile(
            activities=activities,
            schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
            profile_memory=True,
            on_trace_ready=on_ready,
        )
        if args.profiler
        else contextlib.nullcontext()
    )
    with profiler as prof:
        for i in range(iters):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                start = torch.cuda.memory_allocated()
            began = time.perf_counter()
            with record_function("forward"):
                extra = torch.empty(extra_bytes, dtype=torch.uint8, device=device)
                if leak_bytes:
                    leaked.append(torch.empty(leak_bytes, dtype=torch.uint8, device=device))
                loss = F.cross_entropy(model(xs[i]), ys[i])
            with record_function("backward"):
                loss.backward()  # type: ignore[no-untyped-call]
                del extra  # held from forward to the end of backward
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
                steps[str(i)] = {
                    "step_ms": (time.perf_counter() - began) * 1e3,
                    "start_bytes": start,
                    "end_bytes": torch.cuda.memory_allocated(),
                    "peak_bytes": torch.cuda.max_memory_allocated(),
                    "reserved_peak_bytes": torch.cuda.max_memory_reserved(),
                }
            else:
                steps[str(i)] = {
                    "step_ms": (time.perf_counter() - began) * 1e3,
                    **dict.fromkeys(
                        ("start_bytes", "end_bytes", "peak_bytes", "reserved_peak_bytes")
                    ),
                }
            if prof is not None:
                prof.step()

    if args.profiler:
        with (
            open(trace_json, "rb") as src,
            gzip.open(f"{trace_json}.gz", "wb", compresslevel=9) as dst,
        ):
            shutil.copyfileobj(src, dst)
        trace_json.unlink()

    n_params = sum(p.numel() for p in model.parameters())
    meta: dict[str, Any] = {
        "scenario": args.scenario,
        "world_size": 1,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": os.environ.get("SAMPLE_TRACE_COMMAND", "python " + " ".join(sys.argv)),
        "model": f"MLP {'-'.join(map(str, DIMS))}, {n_params} float32 params "
        f"({n_params * 4 / 2**20:.2f} MiB of gradients), batch {BATCH}, SGD, on {device}",
        "profiler": {
            "activities": [a.name for a in activities],
            "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE, "repeat": 1},
            "profile_memory": True,
        }
        if args.profiler
        else "none of the script's own (run under traceview collect)",
        "iterations": iters,
        "gradient_bytes": n_params * 4,
        "steps": {
            "what": "per iteration (the trace's ProfilerStep#N is iteration N): the CUDA "
            "caching allocator's statistics, peak statistics reset at the iteration's start",
            **steps,
        },
    }
    if args.scenario == "gpu_memory":
        meta["extra"] = {
            "bytes": extra_bytes,
            "held": "allocated in forward, freed at the end of backward",
            "peak_phase": "backward",
        }
    else:
        meta["leak"] = {"bytes_per_step": leak_bytes, "where": "forward: appended, never freed"}
    tmp = args.outdir / "groundtruth.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    tmp.replace(args.outdir / "groundtruth.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
