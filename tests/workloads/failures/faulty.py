"""Data parallelism that fails on purpose, one way per run (CPU, gloo, torchrun): issue 49's ground
truth. The fault is on rank --rank at job step --step (the loop's index: the first step the job
runs is step 0), and the job writes what it injected to TRUTH/fault.json before it starts.

  torchrun --standalone --nproc-per-node N faulty.py --fault KIND [--rank R --step K]
      [--timeout S] [--steps N] --truth DIR

Each step: a batch from a DataLoader (in the main process), forward and backward of three
bias-free Linear(64, 64) layers (every gradient the same shape; --shapes differ: 64x64, 64x32,
32x64), then one dist.all_reduce per gradient (call 1, 2, 3 of the step), then the update.
--ddp: the model in DistributedDataParallel instead, whose all-reduces C++ makes in backward
(seen by the Flight Recorder, not by traceview's wrapper).
Faults (KIND):
- hang-io: the rank's batch takes --hang-s (default 600) in the dataset's __getitem__;
- hang-checkpoint: the rank's torch.save writes to a file that does not answer for --hang-s;
- hang-loop: the rank spins in a Python loop;
- skip: the rank leaves out call 2 of the step (with equal shapes gloo pairs the calls that
  follow silently; with --shapes differ the next call's size differs);
- other-op: the rank calls dist.broadcast where the others call all_reduce 2;
- raise: the rank raises RuntimeError after its forward (and a second's pause);
- kill: the rank sends itself SIGKILL after its forward (and a second's pause).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

FAULTS = ("none", "hang-io", "hang-checkpoint", "hang-loop", "skip", "other-op", "raise", "kill")


class Batches(Dataset):
    """Random batches; item ``hang_at`` takes ``hang_s`` to load."""

    def __init__(self, n: int, hang_at: int, hang_s: float) -> None:
        self.n, self.hang_at, self.hang_s = n, hang_at, hang_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.hang_at:
            time.sleep(self.hang_s)
        return torch.randn(16, 64), torch.randint(0, 64, (16,))


class StuckFile(io.BytesIO):
    """A checkpoint's file on a file system that stops answering."""

    def __init__(self, hang_s: float) -> None:
        super().__init__()
        self.hang_s = hang_s

    def write(self, data: bytes) -> int:  # type: ignore[override]
        time.sleep(self.hang_s)
        return super().write(data)


def save_checkpoint(model: nn.Module, hang_s: float) -> None:
    torch.save(model.state_dict(), StuckFile(hang_s))


def spin(seconds: float) -> int:
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=FAULTS, required=True)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=8)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--timeout", type=float, default=6.0)
    parser.add_argument("--hang-s", type=float, default=600.0)
    parser.add_argument("--shapes", choices=["equal", "differ"], default="equal")
    parser.add_argument(
        "--ddp", action="store_true", help="DistributedDataParallel's own all-reduces"
    )
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    if rank == 0:
        Path(args.truth).mkdir(parents=True, exist_ok=True)
        fault = {"fault": args.fault, "rank": args.rank, "step": args.step,
                 "world": dist.get_world_size(), "shapes": args.shapes}  # fmt: skip
        (Path(args.truth) / "fault.json").write_text(json.dumps(fault))
    faulty = rank == args.rank
    dims = (
        [(64, 64), (64, 64), (64, 64)] if args.shapes == "equal" else [(64, 32), (32, 64), (64, 64)]
    )
    model: nn.Module = nn.Sequential(*(nn.Linear(i, o, bias=False) for i, o in dims))
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hang_at = args.step if faulty and args.fault == "hang-io" else -1
    loader = iter(DataLoader(Batches(args.steps, hang_at, args.hang_s), batch_size=None))
    for step in range(args.steps):
        x, y = next(loader)
        loss = nn.functional.cross_entropy(model(x), y)
        here = faulty and step == args.step
        if here and args.fault in ("raise", "kill"):
            # (the others reach the step's first all-reduce and wait there for this rank: on a
            # loaded machine they could still be in their backward when the launcher ends them)
            time.sleep(1.0)
        if here and args.fault == "raise":
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if here and args.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        for call, p in enumerate([] if args.ddp else model.parameters(), start=1):
            if here and call == 2 and args.fault == "skip":
                continue
            if here and call == 2 and args.fault == "other-op":
                dist.broadcast(p.grad, src=0)
                continue
            dist.all_reduce(p.grad)
        if here and args.fault == "hang-checkpoint":
            save_checkpoint(model, args.hang_s)
        if here and args.fault == "hang-loop":
            spin(args.hang_s)
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
