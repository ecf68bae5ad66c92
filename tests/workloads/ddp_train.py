"""An ordinary DDP training script (gloo, CPU) with no traceview code in it.

Rank and world size come from the launcher: Open MPI, MPICH (Hydra's PMI), torchrun, Slurm or
a single process.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    """`steps` batches of random samples, made on demand from a small pool.

    The pool is at most 16 batches, so a run of 100,000 steps holds 1 MB of data, not the 6.5
    GB a tensor of every sample would take; each sample is still read and collated by the
    DataLoader, as with a TensorDataset.
    """

    def __init__(self, samples: int, pool: int = 64 * 16) -> None:
        self.samples = samples
        self.x = torch.randn(min(samples, pool), 256)
        self.y = torch.randint(0, 10, (len(self.x),))

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i % len(self.x)], self.y[i % len(self.x)]


def launcher_rank() -> tuple[int, int]:
    for rank, size in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("RANK", "WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def _meet(folder: Path, rank: int, world: int, waits: bool) -> None:
    """Mark this rank as at the failing step; the failing rank waits (up to a minute) for every
    rank's mark, so ranks that train apart (--no-ddp) are all past their profiles when it fails."""
    (folder / f"rank-{rank}").touch()
    deadline = time.monotonic() + 60
    while waits and time.monotonic() < deadline:
        if sum(1 for _ in folder.glob("rank-*")) >= world:
            return
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises an error")
    parser.add_argument("--fail-at", type=int, default=4, help="... at this step")
    parser.add_argument("--no-ddp", action="store_true", help="ranks train independently")
    parser.add_argument(
        "--meet",
        type=Path,
        help="a folder: at --fail-at every rank marks it, the failing one waits",
    )
    parser.add_argument("--port", default="29650")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank, world = launcher_rank()
    distributed = world > 1 and not args.no_ddp
    if distributed:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", args.port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model: nn.Module = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    if distributed:
        model = DistributedDataParallel(model, bucket_cap_mb=1)
    loader = DataLoader(Batches(64 * args.steps), batch_size=64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        if step == args.fail_at and args.meet is not None:
            _meet(args.meet, rank, world, waits=rank == args.fail_rank)
        if step == args.fail_at and rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose at step {step}")
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    if distributed:
        # as examples/train.py ends: gloo torn down at exit, DDP's work still held, can abort
        del model, optimizer
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {rank}: done, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
