"""Arrival: a plain gloo all-reduce job where one rank does known extra forward work.

  torchrun --standalone --nproc-per-node N arrival.py --slow-rank R --extra 40 --truth DIR

Each step: forward (the slow rank first does --extra 192x192 matmuls), backward, one explicit
dist.all_reduce per gradient (in parameter order, no DDP), update. Timers per rank (see
_common): "step", "forward", "backward", "update", and "allreduce" around each call (mb: the
call's index in the step, "bytes": its size). Across ranks (one machine, one CLOCK_MONOTONIC),
a rank's wait in call k is the last rank's t0 minus its own t0.
"""

from __future__ import annotations

import argparse
import time

import _common as C
import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--slow-rank", type=int, default=-1, help="default: the last rank")
    parser.add_argument("--extra", type=int, default=40)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    rank, world = C.start()
    slow = args.slow_rank % world
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    timers = C.Timers()
    for step in range(args.steps):
        timers.step = step
        with timers.timed("step"):
            optimizer.zero_grad()
            with timers.timed("forward"):
                if rank == slow:
                    C.busy(args.extra)
                loss = nn.functional.cross_entropy(model(x), y)
            with timers.timed("backward"):
                loss.backward()
            for k, p in enumerate(model.parameters()):
                assert p.grad is not None
                t0 = time.perf_counter_ns()
                dist.all_reduce(p.grad)
                timers.add("allreduce", t0, time.perf_counter_ns(), k, bytes=p.grad.nbytes)
            with timers.timed("update"):
                optimizer.step()
    groups = [C.group_entry(dist.group.WORLD, None)]
    C.write_truth(args.truth, "arrival", rank, world, args, groups, timers, slow_rank=slow)
    C.finish()


if __name__ == "__main__":
    main()
