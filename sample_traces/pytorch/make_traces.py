"""Make small, real PyTorch profiler traces of a distributed CPU training run, with ground truth.

Usage (one process per rank, launched by Open MPI):

    mpirun -np 2 python sample_traces/pytorch/make_traces.py SCENARIO OUTDIR

SCENARIO is one of:
  ddp       DistributedDataParallel (bucket_cap_mb=1): gradient all-reduces run per bucket
            on gloo threads while backward still computes (communication partly hidden).
  explicit  no DDP: after loss.backward(), a synchronous dist.all_reduce(p.grad) per parameter,
            then opt.step() (communication fully exposed).
  slowio    DDP as above, but the DataLoader's Dataset decodes every sample slowly
            (zlib + a per-sample read latency), so data loading dominates the step.
  slowfwd   explicit, but rank 1 (the straggler) runs its model's forward twice more under
            torch.no_grad(): its forward takes about three times the others', and the others
            wait for it in their first all-reduce of every step. Made with 3 ranks.
  slowdata  explicit, but rank 1's batches take SLOW_DATA_S longer to load (a sleep in its
            collate_fn, standing in for a slow file system on one node). Made with 2 ranks.

Each rank writes OUTDIR/rank-<r>.pt.trace.json.gz; rank 0 writes OUTDIR/groundtruth.json with
time.perf_counter() timers for every iteration (see sample_traces/README.md for the format).
Rank and world size come from OMPI_COMM_WORLD_RANK/SIZE, else RANK/WORLD_SIZE, else 0/1.
MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to a per-scenario port (env overrides both).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import platform
import shutil
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

SCENARIOS = {
    "ddp": 29511,
    "explicit": 29512,
    "slowio": 29513,
    "slowfwd": 29514,
    "slowdata": 29515,
}  # scenario -> default MASTER_PORT
DIMS = (512, 1024, 1024, 1024, 10)  # MLP layer widths: in, hidden..., classes
BATCH = 128
LR = 0.01
BUCKET_CAP_MB = 1.0
WAIT, WARMUP, ACTIVE = 1, 1, 5
ITERS = WAIT + WARMUP + ACTIVE + 3  # 3 unprofiled steps after the window, for comparison
SLOW_RAW_BYTES = 512 * 64  # slowio: each sample decodes 32 KiB of uint8 "pixels"
SLOW_SLEEP_S = 0.0003  # slowio: simulated storage latency per sample
SLOW_RANK = 1  # slowfwd, slowdata: the straggler
EXTRA_FORWARDS = 2  # slowfwd: extra forward passes (no grad) on the straggler
SLOW_DATA_S = 0.015  # slowdata: extra loading time per batch on the straggler


def env_int(*names: str, default: int) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


class FastDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """In-memory tensors: fetching a batch costs only indexing and collation."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, DIMS[0], generator=g)
        self.y = torch.randint(0, DIMS[-1], (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class SlowDataset(Dataset[tuple[bytes, int]]):
    """Each sample is 'read' (sleep) and inflated (zlib) on access; slow_collate decodes."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        # Low-entropy uint8 "pixels" so zlib has real work to do when inflating.
        raw = torch.randint(0, 16, (SLOW_RAW_BYTES,), dtype=torch.uint8, generator=g)
        self.blob = zlib.compress(bytes(raw.tolist()), 6)
        self.y = torch.randint(0, DIMS[-1], (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        time.sleep(SLOW_SLEEP_S)
        return zlib.decompress(self.blob), self.y[i]


def slow_collate(batch: list[tuple[bytes, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 pixels -> per-feature float means, normalized (a few aten ops per batch)."""
    pixels = torch.frombuffer(bytearray(b"".join(b for b, _ in batch)), dtype=torch.uint8)
    x = pixels.view(len(batch), DIMS[0], -1).float().mean(dim=2).sub_(7.5).div_(4.6)
    return x, torch.tensor([y for _, y in batch])


def slow_rank_collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    time.sleep(SLOW_DATA_S)  # a slow file system on this rank's node
    return torch.utils.data.default_collate(batch)


def make_model() -> nn.Sequential:
    torch.manual_seed(0)  # identical initial weights on every rank
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(DIMS):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in SCENARIOS:
        print(f"usage: {argv[0]} {{{'|'.join(SCENARIOS)}}} OUTDIR", file=sys.stderr)
        return 2
    scenario, outdir = argv[1], Path(argv[2])
    rank = env_int("OMPI_COMM_WORLD_RANK", "RANK", default=0)
    world = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(SCENARIOS[scenario]))
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    outdir.mkdir(parents=True, exist_ok=True)

    model = make_model()
    use_ddp = scenario in ("ddp", "slowio")
    net: nn.Module = (
        DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB) if use_ddp else model
    )
    # Explicit mode sums gradients; dividing lr by world size makes that an average.
    opt = torch.optim.SGD(net.parameters(), lr=LR if use_ddp else LR / world)
    params = [p for p in net.parameters() if p.requires_grad]
    n, seed = ITERS * BATCH, 1000 + rank
    loader = (
        DataLoader(SlowDataset(n, seed), batch_size=BATCH, num_workers=0, collate_fn=slow_collate)
        if scenario == "slowio"
        else DataLoader(
            FastDataset(n, seed), batch_size=BATCH, num_workers=0, collate_fn=slow_rank_collate
        )
        if scenario == "slowdata" and rank == SLOW_RANK
        else DataLoader(FastDataset(n, seed), batch_size=BATCH, num_workers=0)
    )
    extra_forwards = EXTRA_FORWARDS if scenario == "slowfwd" and rank == SLOW_RANK else 0

    sched = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    recorded = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    trace_json = outdir / f"rank-{rank}.pt.trace.json"

    def on_ready(p: profile) -> None:
        p.export_chrome_trace(str(trace_json))

    ms = 1e3
    records: list[dict[str, Any]] = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=sched,
        record_shapes=True,
        on_trace_ready=on_ready,
    ) as prof:
        it = iter(loader)
        for _ in range(ITERS):
            step = prof.step_num  # the N of this iteration's ProfilerStep#N
            start_unix_us = time.time_ns() / 1e3
            t0 = time.perf_counter()
            x, y = next(it)
            t1 = time.perf_counter()
            loss = F.cross_entropy(net(x), y)
            with torch.no_grad():
                for _ in range(extra_forwards):  # slowfwd: the straggler's extra compute
                    net(x)
            t2 = time.perf_counter()
            loss.backward()  # type: ignore[no-untyped-call]
            t3 = time.perf_counter()
            t4 = t3  # DDP: no separate all-reduce phase (it runs inside backward)
            if not use_ddp:
                for p in params:
                    dist.all_reduce(p.grad)  # synchronous: blocks until the sum arrives
                t4 = time.perf_counter()
            opt.step()
            t5 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            t6 = time.perf_counter()
            records.append(
                {
                    "rank": rank,
                    "step": step,
                    "data_ms": round((t1 - t0) * ms, 4),
                    "forward_ms": round((t2 - t1) * ms, 4),
                    "backward_ms": round((t3 - t2) * ms, 4),
                    "allreduce_ms": round((t4 - t3) * ms, 4),
                    "optimizer_ms": round((t5 - t4) * ms, 4),
                    "zero_grad_ms": round((t6 - t5) * ms, 4),
                    "step_ms": round((t6 - t0) * ms, 4),
                    "profiled": sched(step) in recorded,
                    "start_unix_us": round(start_unix_us, 1),
                }
            )
            prof.step()

    with open(trace_json, "rb") as src, gzip.open(f"{trace_json}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    trace_json.unlink()

    gathered: list[list[dict[str, Any]]] | None = [[] for _ in range(world)] if rank == 0 else None
    dist.gather_object(records, gathered, dst=0)
    if rank == 0 and gathered is not None:
        n_params = sum(p.numel() for p in model.parameters())
        mpi = "OMPI_COMM_WORLD_SIZE" in os.environ
        launcher = f"mpirun -np {world} python " if mpi else "python "
        meta = {
            "scenario": scenario,
            "world_size": world,
            "torch_version": torch.__version__,
            "open_mpi_version": os.environ.get("OMPI_VERSION"),
            "python_version": platform.python_version(),
            "host": platform.node(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": os.environ.get("SAMPLE_TRACE_COMMAND", launcher + " ".join(argv)),
            "model": (
                f"MLP {'-'.join(map(str, DIMS))} (Linear+ReLU, {n_params} float32 params, "
                f"{n_params * 4 / 2**20:.1f} MiB of gradients), cross-entropy loss, "
                f"SGD lr={LR}, batch {BATCH} per rank, torch.set_num_threads(1)"
            ),
            "straggler": (
                {"rank": SLOW_RANK, "phase": "forward", "extra_forwards": EXTRA_FORWARDS}
                if scenario == "slowfwd"
                else {"rank": SLOW_RANK, "phase": "data", "extra_data_s": SLOW_DATA_S}
                if scenario == "slowdata"
                else None
            ),
            "communication": (
                f"DDP gloo, bucket_cap_mb={BUCKET_CAP_MB}; allreduce_ms is 0 (inside backward)"
                if use_ddp
                else "explicit synchronous dist.all_reduce(p.grad) per parameter after backward"
            ),
            "data": (
                "DataLoader(num_workers=0) over SlowDataset: per sample sleep "
                f"{SLOW_SLEEP_S * 1e3} ms + zlib-inflate {SLOW_RAW_BYTES} B; "
                "collate_fn: uint8 -> float mean per feature"
                if scenario == "slowio"
                else "DataLoader(num_workers=0) over in-memory tensors"
            ),
            "profiler": {
                "activities": ["CPU"],
                "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE, "repeat": 1},
                "record_shapes": True,
            },
            "iterations": ITERS,
            "batch_size": BATCH,
            "gradient_bytes": n_params * 4,
            "records": [r for per_rank in gathered for r in per_rank],
        }
        tmp = outdir / "groundtruth.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(outdir / "groundtruth.json")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
