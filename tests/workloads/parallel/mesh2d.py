"""A 2-D mesh job on 4 ranks: dp=2 x tp=2, tensor parallel (DTensor) inside FSDP2, CPU and gloo.

  torchrun --standalone --nproc-per-node 4 mesh2d.py --steps 10 --truth DIR
      [--slow-rank R --extra-ms S]

init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")); an MLP block
(up: ColwiseParallel, down: RowwiseParallel) twice over tp, then fully_shard over dp. The ranks of
one tp group read the same batch (seeded by their dp coordinate). Timers per rank (see _common):
"step", "forward", "backward", "update", and "call" rows for each
collective issued (C.record_collectives: op, group, bytes, phase). With --slow-rank R, rank R's
first block sleeps --extra-ms in its backward, between its two halves (an autograd function
whose backward sleeps inside record_function("extra_backward"), timed as "extra"): its tp peer
waits for it in the block's tensor-parallel all-reduce, its dp peer in FSDP's reduce-scatter.
"""

from __future__ import annotations

import argparse

import _common as C
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

TIMERS = C.Timers()


class Block(nn.Module):
    def __init__(self, extra_ms: float = 0.0) -> None:
        super().__init__()
        self.up = nn.Linear(256, 1024)
        self.down = nn.Linear(1024, 256)
        self.extra_ms = extra_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.up(x))
        if self.extra_ms > 0:
            hidden = C.SleepInBackward.apply(hidden, self.extra_ms, TIMERS)
        return x + self.down(hidden)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--truth", required=True)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--extra-ms", type=float, default=0.0)
    args = parser.parse_args()
    rank, world = C.start()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = nn.Sequential(Block(args.extra_ms if rank == args.slow_rank else 0.0), Block())
    for block in model:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dp = mesh.get_coordinate()[0]  # type: ignore[index]
    torch.manual_seed(100 + dp)
    x, y = torch.randn(32, 256), torch.randn(32, 256)
    timers = TIMERS
    C.record_collectives(timers)
    for step in range(args.steps):
        timers.step = step
        with timers.timed("step"):
            optimizer.zero_grad()
            with timers.timed("forward"):
                loss = nn.functional.mse_loss(model(x), y)
            with timers.timed("backward"):
                loss.backward()
            with timers.timed("update"):
                optimizer.step()
    groups = [
        C.group_entry(dist.group.WORLD, None),
        C.group_entry(mesh.get_group("dp"), "dp"),
        C.group_entry(mesh.get_group("tp"), "tp"),
    ]
    C.write_truth(
        args.truth, "mesh2d", rank, world, args, groups, timers,
        mesh={"shape": list(mesh.shape), "dims": list(mesh.mesh_dim_names or ()),
              "coordinate": mesh.get_coordinate(), "mesh": mesh.mesh.tolist()},
        slow_rank=args.slow_rank,
    )  # fmt: skip
    C.finish()


if __name__ == "__main__":
    main()
