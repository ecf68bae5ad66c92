"""Expert parallelism with imbalanced routing on 4 ranks: each rank holds one expert; every
step each rank sends its tokens to the experts through all_to_all_single inside a custom
autograd Function (forward: dispatch and combine; backward: the same exchanges reversed),
CPU and gloo.

  torchrun --standalone --nproc-per-node 4 moe.py --steps 12 --truth DIR [--hot 3 --skew 3]

Rank r sends TOKENS rows to every expert, except the hot expert (--hot), which gets --skew times
as many: expert HOT computes --skew times the others' work in forward and backward, and the
other ranks wait for it inside the all-to-alls. Timers per rank (see _common): "step",
"forward", "backward", "update"; "alltoall" around every all_to_all_single (phase: forward or
backward; the time the training thread is blocked in the exchange), "expert" around the expert's
forward, "expert_backward" from its output's gradient to its input's (tensor hooks).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import _common as C
import torch
import torch.distributed as dist
from torch import nn

TOKENS, WIDTH, HIDDEN = 64, 64, 8192


class AllToAll(torch.autograd.Function):
    """all_to_all_single with split sizes; its backward sends the gradients back the same way."""

    timers: C.Timers

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> Any:
        ctx.splits = (out_splits, in_splits)
        y = x.new_empty(sum(out_splits), x.shape[1])
        t0 = time.perf_counter_ns()
        dist.all_to_all_single(y, x.contiguous(), out_splits, in_splits)
        AllToAll.timers.add("alltoall", t0, time.perf_counter_ns(), phase="forward")
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), grad.shape[1])
        t0 = time.perf_counter_ns()
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        AllToAll.timers.add("alltoall", t0, time.perf_counter_ns(), phase="backward")
        return back, None, None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--truth", required=True)
    parser.add_argument("--hot", type=int, default=3, help="the expert that gets more tokens")
    parser.add_argument("--skew", type=int, default=3, help="how many times more")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="the experts' hidden width")
    args = parser.parse_args()
    rank, world = C.start()
    timers = C.Timers()
    AllToAll.timers = timers
    sent = [TOKENS * (args.skew if j == args.hot else 1) for j in range(world)]
    received = [TOKENS * (args.skew if rank == args.hot else 1)] * world
    gate = nn.Linear(WIDTH, WIDTH)
    expert = nn.Sequential(nn.Linear(WIDTH, args.hidden), nn.ReLU(), nn.Linear(args.hidden, WIDTH))
    params = [*gate.parameters(), *expert.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    x = torch.randn(sum(sent), WIDTH)
    for step in range(args.steps):
        timers.step = step
        with timers.timed("step"):
            optimizer.zero_grad()
            with timers.timed("forward"):
                routed = AllToAll.apply(gate(x), received, sent)  # dispatch
                with timers.timed("expert"):
                    out = expert(routed)
                # the expert's backward: from its output's gradient to its input's
                began: list[int] = []
                out.register_hook(lambda g, b=began: b.append(time.perf_counter_ns()))
                routed.register_hook(
                    lambda g, b=began: timers.add("expert_backward", b[0], time.perf_counter_ns())
                )
                back = AllToAll.apply(out, sent, received)  # combine
                loss = back.pow(2).mean()
            with timers.timed("backward"):
                loss.backward()
            with timers.timed("update"):
                optimizer.step()
    groups = [C.group_entry(dist.group.WORLD, None)]
    C.write_truth(
        args.truth, "moe", rank, world, args, groups, timers, sent=sent, received=received
    )
    C.finish()


if __name__ == "__main__":
    main()
