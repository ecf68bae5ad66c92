"""Data parallelism with injected, timed causes: a rank that starts a step late, a rank that
idles inside a step, a rank with extra backward work (CPU, gloo, torchrun).

  torchrun --standalone --nproc-per-node N dp.py --mode explicit|ddp [--slow-rank R]
      [--extra-ms Y] [--late-ms S --late-step K] [--late-every-ms S4] [--idle-every-ms S3]
      [--idle-ms S2 --idle-step J] --truth DIR

The model: Linear(256, 512), ReLU, Linear(512, 512), ReLU, Linear(512, 10) on a batch of 64;
between the two ReLUs an autograd function `Extra` whose backward sleeps --extra-ms on the slow
rank inside record_function("extra_backward") (an operator of the backward pass in the trace;
a sleep rather than matmuls so that three ranks on two loaded cores do not slow each other).
explicit: after backward, one dist.all_reduce of all gradients flattened into one tensor
(communication fully exposed; one call rather than one per gradient keeps gloo's per-call cost on
two loaded cores small against the injected causes); ddp: DistributedDataParallel with 1 MiB
buckets (the later layers' gradients are all-reduced while the slow rank still sleeps in the
middle of its backward: overlap), its all-reduce issued by a comm hook that times each bucket's
hand-over ("bucket": t0 = t1 = the moment the bucket's gradients are ready, mb = its index), so
that a rank's backward compute (backward's start to its last bucket) is told from its wait for
the others (its last bucket to backward's end).

Injections on the slow rank (each timed by the timer of its own name, see _common):
- "late": --late-ms, in job step K-1 after the all-reduces and before optimizer.step(), so that
  the rank's profiler step K (which begins in the optimizer's post-step hook) starts that late
  while the other ranks start on time and block in step K's first collective. With
  `traceview collect --skip 1 --warmup 2`, K = 4 is the first recorded step.
- "late" too: --late-every-ms, in every job step at the same place: the rank starts every
  profiler step that late, having idled at the end of the one before (outside every operator).
- "idle": --idle-ms, at the top of job step J, before zero_grad: inside the step, outside
  every operator.
- "extra": --extra-ms, inside the backward pass (every step).
- "idle" too: --idle-every-ms, at the top of every job step (the profiler's step begins in the
  optimizer's post-step hook just before it), before any operator: what a sleep after each
  update is under the collector.
Timers per rank: "step" (the loop body), "forward", "backward", "allreduce" (explicit: the
call, "bytes" its size), "bucket" (ddp, above), "update" (optimizer.step(), which also holds the
profiler's step hook: the trace export on the last recorded step), and the injections above.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))

import _common as C
import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

TIMERS = C.Timers()


class Model(nn.Module):
    def __init__(self, extra_ms: float) -> None:
        super().__init__()
        self.a = nn.Linear(256, 512)
        self.b = nn.Linear(512, 512)
        self.c = nn.Linear(512, 10)
        self.extra_ms = extra_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = C.SleepInBackward.apply(torch.relu(self.a(x)), self.extra_ms, TIMERS)
        return self.c(torch.relu(self.b(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["explicit", "ddp"], default="explicit")
    parser.add_argument("--steps", type=int, default=26)
    parser.add_argument("--slow-rank", type=int, default=-1, help="default: the last rank")
    parser.add_argument("--extra-ms", type=float, default=0.0)
    parser.add_argument("--late-ms", type=float, default=0.0)
    parser.add_argument("--late-step", type=int, default=4)
    parser.add_argument("--late-every-ms", type=float, default=0.0)
    parser.add_argument("--idle-every-ms", type=float, default=0.0)
    parser.add_argument("--idle-ms", type=float, default=0.0)
    parser.add_argument("--idle-step", type=int, default=7)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    rank, world = C.start()
    slow = rank == args.slow_rank % world
    model: nn.Module = Model(args.extra_ms if slow else 0.0)
    if args.mode == "ddp":
        model = DistributedDataParallel(model, bucket_cap_mb=1)

        def hook(state: Any, bucket: dist.GradBucket) -> Any:
            now = time.perf_counter_ns()
            TIMERS.add("bucket", now, now, bucket.index(), bytes=bucket.buffer().nbytes)
            return default_hooks.allreduce_hook(state, bucket)

        # DDP compares the annotations with its types (strings here: __future__ annotations)
        hook.__annotations__.update(bucket=dist.GradBucket)
        hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
        model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    timers = TIMERS
    for step in range(args.steps):
        timers.step = step
        with timers.timed("step"):
            if slow and step == args.idle_step and args.idle_ms > 0:
                with timers.timed("idle"):
                    time.sleep(args.idle_ms / 1000)
            if slow and args.idle_every_ms > 0:
                with timers.timed("idle"):
                    time.sleep(args.idle_every_ms / 1000)
            optimizer.zero_grad()
            with timers.timed("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with timers.timed("backward"):
                loss.backward()
            if args.mode == "explicit":
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                flat = _flatten_dense_tensors(grads)
                t0 = time.perf_counter_ns()
                dist.all_reduce(flat)
                timers.add("allreduce", t0, time.perf_counter_ns(), 0, bytes=flat.nbytes)
                for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                    g.copy_(reduced)
            if slow and step == args.late_step - 1 and args.late_ms > 0:
                with timers.timed("late"):
                    time.sleep(args.late_ms / 1000)
            if slow and args.late_every_ms > 0:
                with timers.timed("late"):
                    time.sleep(args.late_every_ms / 1000)
            with timers.timed("update"):
                optimizer.step()
    groups = [C.group_entry(dist.group.WORLD, None)]
    C.write_truth(
        args.truth, f"dp-{args.mode}", rank, world, args, groups, timers,
        slow_rank=args.slow_rank % world,
    )  # fmt: skip
    C.finish()


if __name__ == "__main__":
    main()
