"""A long data-parallel job whose step time changes at a known step: for watching it live.

  torchrun --standalone --nproc-per-node N live_train.py --steps 400 --work-ms 20
      [--slow-rank R --slow-from K --factor 1.3] [--hang-rank R --hang-at H] --truth DIR

Every step on every rank: its work (--work-ms of sleep, with a small matmul forward and
backward: sleeping keeps four ranks on two loaded cores from slowing each other), then one
explicit gloo all-reduce of the gradients (the wait for the slowest rank lands there), then the
optimizer's step. From step K on, rank R's work takes --factor times as long. With --hang-rank,
rank R stops in its work at step H (sleeping) until it is killed: a hang outside any collective.

Timers per rank (tests/workloads/parallel/_common.py's truth file): "step", "work" (its own
work), "allreduce" (the call).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "parallel"))

import _common as C
import torch
import torch.distributed as dist
from torch import nn

TIMERS = C.Timers()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-from", type=int, default=150)
    parser.add_argument("--factor", type=float, default=1.3)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    rank, world = C.start()
    model = nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    timers = TIMERS
    for step in range(args.steps):
        timers.step = step
        with timers.timed("step"):
            optimizer.zero_grad()
            with timers.timed("work"):
                loss = model(x).square().mean()
                loss.backward()
                slow = rank == args.slow_rank and step >= args.slow_from
                time.sleep(args.work_ms * (args.factor if slow else 1.0) / 1000)
                if rank == args.hang_rank and step == args.hang_at:
                    while True:  # (killed by the test)
                        time.sleep(1)
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            with timers.timed("allreduce"):
                dist.all_reduce(flat)
            optimizer.step()
        if step % 50 == 0:
            print(f"rank {rank} step {step}", flush=True)
    C.write_truth(args.truth, "live_train", rank, world, args, [], timers)
    C.finish()


if __name__ == "__main__":
    main()
