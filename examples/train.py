"""A minimal data-parallel training script: PyTorch DDP over gloo, on CPU, with no traceview code.

Run it under any launcher, with or without `traceview collect` in front:

    python examples/train.py                                     # one process
    mpirun -np 2 python examples/train.py                        # Open MPI or MPICH
    torchrun --nproc-per-node 2 examples/train.py

Each rank reads its rank and the world size from the launcher's variables. Rank 0's address is
MASTER_ADDR (default 127.0.0.1: one machine) and its port MASTER_PORT (default 29500); torchrun
sets both. Every step trains a small MLP on one batch of random data and all-reduces its
gradients (DDP), so a profile shows data loading, forward, backward, communication and the
optimizer update.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


def launcher_rank() -> tuple[int, int]:
    """(rank, world size) from torchrun, Open MPI, MPICH/Intel MPI or Slurm; (0, 1) alone."""
    for rank, size in (
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


class RandomBatches(Dataset):
    """Random samples, made from a small pool on demand (memory does not grow with --steps)."""

    def __init__(self, samples: int, features: int, classes: int) -> None:
        self.samples = samples
        self.x = torch.randn(min(samples, 1024), features)
        self.y = torch.randint(0, classes, (len(self.x),))

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i % len(self.x)], self.y[i % len(self.x)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # ranks share the machine's cores
    rank, world = launcher_rank()
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=rank, world_size=world)

    model: nn.Module = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    if world > 1:
        model = DistributedDataParallel(model)
    loader = DataLoader(RandomBatches(args.batch_size * args.steps, 256, 10), args.batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"rank {rank} of {world}: {args.steps} steps, loss {loss.item():.3f}")
    if world > 1:
        # Free DDP's pending work (it holds tensors) while the interpreter is whole, and let
        # every rank finish before the group goes: gloo torn down at exit can abort (SIGABRT)
        del model, optimizer
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
