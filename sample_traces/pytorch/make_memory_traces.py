"""Make small, real PyTorch profiler traces with memory records (profile_memory=True) of a
2-rank DDP run on CPU that allocates known tensors in known phases on known ranks.

Usage (one process per rank, launched by Open MPI):

    mpirun -np 2 python sample_traces/pytorch/make_memory_traces.py SCENARIO OUTDIR

SCENARIO is one of:
  memory  rank 0 (EXTRA_RANK) allocates an extra EXTRA_MIB MiB tensor in forward and holds it to
          the end of backward; rank 1 does not. The gradients (set to None by zero_grad at the
          end of every step) are allocated in backward while the extra tensor is still held, so
          rank 0's peak falls in backward, EXTRA_MIB above rank 1's.
  leak    every rank appends a (rank + 1) * LEAK_MIB MiB tensor to a list in forward at every
          step and never frees it: rank 0 leaks LEAK_MIB MiB per step, rank 1 twice that.

Each rank writes OUTDIR/rank-<r>.pt.trace.json.gz; rank 0 writes OUTDIR/groundtruth.json with the
known sizes (see sample_traces/README.md). The sizes are the ground truth: the script makes them.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, record_function, schedule

SCENARIOS = {"memory": 29521, "leak": 29522}  # scenario -> default MASTER_PORT
DIMS = (256, 1024, 10)
BATCH = 32
EXTRA_RANK = 0
EXTRA_MIB = 256
LEAK_MIB = 2
WAIT, WARMUP, ACTIVE = 1, 1, 5
ITERS = WAIT + WARMUP + ACTIVE


def env_int(*names: str, default: int) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in SCENARIOS:
        print(f"usage: {argv[0]} {{{'|'.join(SCENARIOS)}}} OUTDIR", file=sys.stderr)
        return 2
    scenario, outdir = argv[1], Path(argv[2])
    rank = env_int("OMPI_COMM_WORLD_RANK", "RANK", default=0)
    world = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(SCENARIOS[scenario]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    outdir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIMS[0], DIMS[1]), nn.ReLU(), nn.Linear(DIMS[1], DIMS[2]))
    net = DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1000 + rank)
    xs = torch.randn(ITERS, BATCH, DIMS[0], generator=g)
    ys = torch.randint(0, DIMS[-1], (ITERS, BATCH), generator=g)
    extra_bytes = EXTRA_MIB << 20 if scenario == "memory" and rank == EXTRA_RANK else 0
    leak_bytes = (rank + 1) * LEAK_MIB << 20 if scenario == "leak" else 0
    leaked: list[torch.Tensor] = []

    trace_json = outdir / f"rank-{rank}.pt.trace.json"

    def on_ready(p: profile) -> None:
        p.export_chrome_trace(str(trace_json))

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        profile_memory=True,
        on_trace_ready=on_ready,
    ) as prof:
        for i in range(ITERS):
            with record_function("forward"):
                extra = torch.empty(extra_bytes, dtype=torch.uint8) if extra_bytes else None
                if leak_bytes:
                    leaked.append(torch.empty(leak_bytes, dtype=torch.uint8))
                loss = F.cross_entropy(net(xs[i]), ys[i])
            with record_function("backward"):
                loss.backward()  # type: ignore[no-untyped-call]
                del extra  # held from forward to the end of backward
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            prof.step()

    with open(trace_json, "rb") as src, gzip.open(f"{trace_json}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    trace_json.unlink()

    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        meta: dict[str, Any] = {
            "scenario": scenario,
            "world_size": world,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": os.environ.get("SAMPLE_TRACE_COMMAND", "python " + " ".join(argv)),
            "model": f"MLP {'-'.join(map(str, DIMS))}, {n_params} float32 params "
            f"({n_params * 4 / 2**20:.2f} MiB of gradients), DDP gloo, batch {BATCH}, SGD",
            "profiler": {
                "activities": ["CPU"],
                "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE, "repeat": 1},
                "profile_memory": True,
            },
            "iterations": ITERS,
            "gradient_bytes": n_params * 4,
        }
        if scenario == "memory":
            meta["extra"] = {
                "rank": EXTRA_RANK,
                "bytes": EXTRA_MIB << 20,
                "held": "allocated in forward, freed at the end of backward",
                "peak_phase": "backward",
            }
        else:
            meta["leak"] = {
                "bytes_per_step": {str(r): (r + 1) * LEAK_MIB << 20 for r in range(world)},
                "where": "forward: appended to a list, never freed",
            }
        tmp = outdir / "groundtruth.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(outdir / "groundtruth.json")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
