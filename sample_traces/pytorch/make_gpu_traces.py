"""Make small, real PyTorch profiler traces of single-GPU training runs, with ground truth.

Usage:

    python sample_traces/pytorch/make_gpu_traces.py SCENARIO OUTDIR [--device cuda|cpu] [--small]

SCENARIO is one of:
  gpu_sync           one process, no process group. Every phase ends with
                     torch.cuda.synchronize(), so each timer covers the phase's GPU work.
  gpu_async          the same, but only one synchronize at the end of the step: phase timers
                     measure kernel *launch* time, step_ms is the real step time.
  gpu_ddp_nccl       DistributedDataParallel (bucket_cap_mb=5), NCCL, world size 1; synchronized.
  gpu_explicit_nccl  no DDP; NCCL world size 1; after backward a dist.all_reduce(p.grad) loop,
                     then synchronize, timed as allreduce_ms; synchronized.
  all                the four above, each in its own subprocess, into OUTDIR/<scenario>/; a
                     failing scenario is reported and the others still run.

Each scenario writes OUTDIR/rank-0.pt.trace.json.gz (export_chrome_trace, gzipped) and
OUTDIR/groundtruth.json: per-iteration time.perf_counter() timers in the format of
sample_traces/pytorch/*/groundtruth.json, plus "synchronized", device and library versions,
and what the exported trace holds ("trace", "nccl_kernels_in_trace").

With --device cpu (for testing without a GPU) the process group uses gloo, the profiler records
CPU activity only and "synchronize" is a no-op; --small shrinks the batch for a quick run.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset

SCENARIOS = ("gpu_sync", "gpu_async", "gpu_ddp_nccl", "gpu_explicit_nccl")
WAIT, WARMUP, ACTIVE, AFTER = 1, 2, 5, 3  # AFTER: unprofiled steps after the window
ITERS = WAIT + WARMUP + ACTIVE + AFTER
WIDTHS = (64, 128, 256, 512)  # channels of the 4 residual stages
CLASSES = 100
LR, MOMENTUM = 0.01, 0.9
BUCKET_CAP_MB = 5.0
PHASES = ("data", "h2d", "forward", "backward", "allreduce", "optimizer", "zero_grad", "end_sync")
NCCL_NAME = re.compile("nccl", re.IGNORECASE)
STEP_NAME = re.compile(r"ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class Workload:
    batch: int
    image: int  # square input images, 3 channels


FULL = Workload(batch=256, image=96)  # 28.3 MB of float32 input per step
SMALL = Workload(batch=32, image=32)


class Block(nn.Module):
    """ResNet basic block: two 3x3 conv+BN, ReLU, identity or 1x1-conv shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def make_model() -> nn.Sequential:
    """Small ResNet: stride-2 stem, one block per stage, global average pool, linear head."""
    torch.manual_seed(0)
    blocks = [Block(WIDTHS[0], WIDTHS[0], 1)]
    blocks += [Block(a, b, 2) for a, b in itertools.pairwise(WIDTHS)]
    return nn.Sequential(
        nn.Conv2d(3, WIDTHS[0], 3, 2, 1, bias=False),
        nn.BatchNorm2d(WIDTHS[0]),
        nn.ReLU(),
        *blocks,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(WIDTHS[-1], CLASSES),
    )


def strict_fp32() -> str:
    """Turn TF32 off for cuDNN convolutions and cuBLAS matmuls.

    Only the legacy flags: torch >= 2.9 raises on reading them once the new fp32_precision
    API has also been used, so the two must not be mixed.
    """
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return (
        "float32, TF32 off (torch.backends.cudnn.allow_tf32 = "
        "torch.backends.cuda.matmul.allow_tf32 = False)"
    )


class Stopwatch:
    """Laps since the previous lap; with a sync function, each lap first waits for the GPU."""

    def __init__(self, sync: Callable[[], None] | None) -> None:
        self.sync = sync
        self.start = self.last = time.perf_counter()

    def lap(self) -> float:
        if self.sync is not None:
            self.sync()
        now = time.perf_counter()
        dt, self.last = now - self.last, now
        return dt

    def total(self) -> float:
        return self.last - self.start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def versions(device: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {
        "device": platform.processor() or platform.machine(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": None,
        "nccl_version": None,
        "python_version": platform.python_version(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out["device"] = props.name
        out["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        out["device_multiprocessors"] = props.multi_processor_count
        out["cudnn_version"] = torch.backends.cudnn.version()
        try:
            v = torch.cuda.nccl.version()
            out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # NCCL missing from this build: record why
            out["nccl_version"] = f"unavailable: {e}"
    return out


def inspect_trace(path: Path) -> dict[str, Any]:
    """What the exported trace holds: profiler steps, kernel time per step, NCCL-named events."""
    with open(path) as f:
        events: list[dict[str, Any]] = json.load(f).get("traceEvents", [])
    steps: dict[int, dict[str, Any]] = {}
    gpu_steps: dict[int, float] = {}
    nccl_by_cat: Counter[str] = Counter()
    cats: Counter[str] = Counter()
    gpu_work: list[tuple[float, float, str]] = []  # (ts, dur, cat) of kernels and memcpys
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = str(e.get("cat", "")), str(e.get("name", ""))
        cats[cat] += 1
        if NCCL_NAME.search(name):
            nccl_by_cat[cat] += 1
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu_work.append((float(e["ts"]), float(e.get("dur", 0.0)), cat))
        m = STEP_NAME.match(name)
        if m is None:
            continue
        n = int(m.group(1))
        if cat == "gpu_user_annotation":
            gpu_steps[n] = round(float(e.get("dur", 0.0)) / 1e3, 4)
        else:
            steps[n] = {"ts": float(e["ts"]), "dur_ms": round(float(e.get("dur", 0.0)) / 1e3, 4)}
    per_step: dict[str, dict[str, Any]] = {}
    for n, s in sorted(steps.items()):
        lo, hi = s["ts"], s["ts"] + s["dur_ms"] * 1e3
        inside = [(d, c) for t, d, c in gpu_work if lo <= t < hi]
        per_step[str(n)] = {
            "profiler_step_ms": s["dur_ms"],
            "gpu_annotation_ms": gpu_steps.get(n),  # GPU-side span of ProfilerStep#N, if any
            "kernels": sum(1 for _, c in inside if c == "kernel"),
            "kernel_ms": round(sum(d for d, c in inside if c == "kernel") / 1e3, 4),
            "memcpy_ms": round(sum(d for d, c in inside if c == "gpu_memcpy") / 1e3, 4),
        }
    return {
        "profiler_steps": sorted(steps),
        "events_by_cat": dict(sorted(cats.items())),
        "nccl_named_events_by_cat": dict(sorted(nccl_by_cat.items())),
        "nccl_kernels": nccl_by_cat.get("kernel", 0),
        "steps": per_step,
    }


def run_scenario(scenario: str, outdir: Path, device: torch.device, work: Workload) -> None:
    use_pg = scenario in ("gpu_ddp_nccl", "gpu_explicit_nccl")
    use_ddp = scenario == "gpu_ddp_nccl"
    synchronized = scenario != "gpu_async"
    cuda = device.type == "cuda"
    backend = "nccl" if cuda else "gloo"
    outdir.mkdir(parents=True, exist_ok=True)
    math = "float32"
    if cuda:
        torch.cuda.set_device(device)
        math = strict_fp32()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    if use_pg:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{free_port()}",
            rank=0,
            world_size=1,
            timeout=timedelta(seconds=60),
            device_id=device if cuda else None,
        )

    model = make_model().to(device)
    net: nn.Module = model
    if use_ddp:
        net = DistributedDataParallel(
            model, device_ids=[device.index or 0] if cuda else None, bucket_cap_mb=BUCKET_CAP_MB
        )
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    params = [p for p in net.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(1000)
    n = ITERS * work.batch
    xs = torch.randn(n, 3, work.image, work.image, generator=g)
    ys = torch.randint(0, CLASSES, (n,), generator=g)
    loader = DataLoader(
        TensorDataset(xs, ys), batch_size=work.batch, num_workers=0, pin_memory=False
    )

    sched = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    recorded = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    trace_json = outdir / "rank-0.pt.trace.json"

    def on_ready(p: profile) -> None:
        p.export_chrome_trace(str(trace_json))

    def all_reduce() -> None:
        for p in params:
            dist.all_reduce(p.grad)  # world size 1: the sum is the gradient itself

    records: list[dict[str, Any]] = []
    with profile(
        activities=activities, schedule=sched, record_shapes=True, on_trace_ready=on_ready
    ) as prof:
        it: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(loader)
        for _ in range(ITERS):
            step = prof.step_num  # the N of this iteration's ProfilerStep#N
            start_unix_us = time.time_ns() / 1e3
            watch = Stopwatch(sync if synchronized else None)
            x_cpu, y_cpu = next(it)
            t_data = watch.lap()
            x, y = x_cpu.to(device), y_cpu.to(device)
            t_h2d = watch.lap()
            loss = F.cross_entropy(net(x), y)
            t_fwd = watch.lap()
            loss.backward()  # type: ignore[no-untyped-call]
            t_bwd = watch.lap()
            t_ar = 0.0  # DDP: its all-reduce runs inside backward
            if scenario == "gpu_explicit_nccl":
                all_reduce()
                t_ar = watch.lap()
            opt.step()
            t_opt = watch.lap()
            opt.zero_grad(set_to_none=True)
            t_zero = watch.lap()
            sync()  # every scenario: the step ends when the GPU is done
            t_end = watch.lap()
            times = (t_data, t_h2d, t_fwd, t_bwd, t_ar, t_opt, t_zero, t_end)
            records.append(
                {
                    "rank": 0,
                    "step": step,
                    **{f"{k}_ms": round(v * 1e3, 4) for k, v in zip(PHASES, times, strict=True)},
                    "step_ms": round(watch.total() * 1e3, 4),
                    "profiled": sched(step) in recorded,
                    "synchronized": synchronized,
                    "start_unix_us": round(start_unix_us, 1),
                }
            )
            prof.step()

    trace = inspect_trace(trace_json)
    gz = outdir / "rank-0.pt.trace.json.gz"
    with open(trace_json, "rb") as src, gzip.open(gz, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    trace["bytes"] = trace_json.stat().st_size
    trace["gz_bytes"] = gz.stat().st_size
    trace_json.unlink()
    profiled = [r["step"] for r in records if r["profiled"]]
    trace["steps_match_groundtruth"] = trace["profiler_steps"] == profiled

    n_params = sum(p.numel() for p in model.parameters())
    info = versions(device)
    meta: dict[str, Any] = {
        "scenario": scenario,
        "world_size": 1,
        "backend": backend if use_pg else None,
        "synchronized": synchronized,
        **info,
        "host": platform.node(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
        "model": (
            f"ResNet-like CNN: 3x3/2 stem conv, 4 basic blocks {'-'.join(map(str, WIDTHS))}, "
            f"avgpool, linear {CLASSES} ({n_params} params, {n_params * 4 / 2**20:.1f} MiB), "
            f"cross-entropy, SGD lr={LR} momentum={MOMENTUM}, batch {work.batch} of "
            f"3x{work.image}x{work.image}"
        ),
        "math": math,
        "communication": {
            "gpu_sync": "none (no process group)",
            "gpu_async": "none (no process group)",
            "gpu_ddp_nccl": f"DDP {backend}, world size 1, bucket_cap_mb={BUCKET_CAP_MB}; "
            "allreduce_ms is 0 (inside backward)",
            "gpu_explicit_nccl": f"{backend}, world size 1: dist.all_reduce(p.grad) for each "
            f"of {len(params)} parameters after backward, then synchronize",
        }[scenario],
        "data": (
            "DataLoader(num_workers=0, pin_memory=False) over an in-memory CPU TensorDataset; "
            f"h2d is a pageable copy of {work.batch * 3 * work.image**2 * 4 / 1e6:.1f} MB"
        ),
        "timers": (
            "each phase ends with torch.cuda.synchronize(): timers cover the GPU work"
            if synchronized
            else "no synchronize inside the step: phase timers measure launch time only; "
            "end_sync_ms is the wait for the GPU at the end, step_ms is the real step time"
        ),
        "profiler": {
            "activities": [a.name for a in activities],
            "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE, "repeat": 1},
            "record_shapes": True,
        },
        "iterations": ITERS,
        "nccl_kernels_in_trace": trace["nccl_kernels"],
        "trace": trace,
        "records": records,
    }
    tmp = outdir / "groundtruth.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    tmp.replace(outdir / "groundtruth.json")
    if use_pg:
        dist.destroy_process_group()


def summary(meta: dict[str, Any]) -> str:
    """One line: per-phase means over profiled steps, Σ phases vs step_ms, trace facts."""
    recs = [r for r in meta["records"] if r["profiled"]]

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in recs)

    sums = [sum(r[f"{p}_ms"] for p in PHASES[:-1]) for r in recs]  # without end_sync
    trace = meta["trace"]
    deltas = [
        trace["steps"][str(r["step"])]["profiler_step_ms"] - r["step_ms"]
        for r in recs
        if str(r["step"]) in trace["steps"]
    ]
    kernel_ms = [s["kernel_ms"] for s in trace["steps"].values()]
    phases = " ".join(f"{p} {mean(f'{p}_ms'):.2f}" for p in PHASES)
    return (
        f"{meta['scenario']}: {phases} | step {mean('step_ms'):.2f}, "
        f"sum of phases w/o end_sync {statistics.fmean(sums):.2f} | "
        f"ProfilerStep-step_ms {min(deltas, default=0):+.3f}..{max(deltas, default=0):+.3f} | "
        f"kernel_ms/step {statistics.fmean(kernel_ms) if kernel_ms else 0:.2f} | "
        f"steps match: {trace['steps_match_groundtruth']} | "
        f"nccl kernels {meta['nccl_kernels_in_trace']} | {trace['gz_bytes'] / 1e6:.2f} MB gz "
        f"| synchronized={meta['synchronized']} on {meta['device']}"
    )


def run_all(outdir: Path, passthrough: list[str], timeout: float) -> int:
    """Each scenario in a fresh process (own CUDA/NCCL state, killable if it hangs)."""
    lines, failed = [], 0
    for scenario in SCENARIOS:
        sub = outdir / scenario
        for stale in ("groundtruth.json", "rank-0.pt.trace.json", "rank-0.pt.trace.json.gz"):
            (sub / stale).unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), scenario, str(sub), *passthrough]
        print(f"=== {scenario}: {' '.join(cmd)}", flush=True)
        t = time.perf_counter()
        try:
            env = os.environ | {"PYTHONUNBUFFERED": "1"}
            rc: int | str = subprocess.run(cmd, timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = f"timed out after {timeout:.0f} s"
        wall = f"{time.perf_counter() - t:.1f} s"
        gt = sub / "groundtruth.json"
        if rc == 0 and gt.exists():
            lines.append(f"OK     ({wall}) {summary(json.loads(gt.read_text()))}")
        else:
            failed += 1
            lines.append(f"FAILED ({wall}) {scenario}: exit {rc}")
    print("=== summary (ms, means over profiled steps)")
    print("\n".join(lines))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help=f"batch {SMALL.batch}, {SMALL.image}px")
    ap.add_argument("--batch", type=int, help="override the batch size")
    ap.add_argument("--image", type=int, help="override the image side (pixels)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per scenario, for 'all' (s)")
    args = ap.parse_args(argv[1:])
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    if args.scenario == "all":
        passthrough = ["--device", args.device, *(["--small"] if args.small else [])]
        passthrough += [f"--{k}={v}" for k in ("batch", "image") if (v := getattr(args, k))]
        return run_all(args.outdir, passthrough, args.timeout)
    base = SMALL if args.small else FULL
    work = Workload(batch=args.batch or base.batch, image=args.image or base.image)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    run_scenario(args.scenario, args.outdir, device, work)
    print(summary(json.loads((args.outdir / "groundtruth.json").read_text())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
