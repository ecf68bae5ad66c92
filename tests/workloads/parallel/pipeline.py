"""A pipeline-parallel job (torch.distributed.pipelining), CPU and gloo: one stage per rank, or
(--schedule interleaved: ScheduleInterleaved1F1B) --virtual V stages per rank (rank r holds
stages r, r + P, ...). (The zero-bubble schedules, ScheduleInterleavedZeroBubble and
ScheduleZBVZeroBubble, fail on CPU with torch 2.13: "Can't detach views in-place" in
stage_backward_input.)

  torchrun --standalone --nproc-per-node P pipeline.py --schedule gpipe|1f1b|interleaved
      --microbatches M [--virtual V] [--slow-stage S --slow-phase forward|backward --extra N]
      --truth DIR

With virtual stages, --slow-stage names a rank: each of its stages does the extra work;
--slow-virtual names one stage (its index in the schedule) that alone does it.

Each stage is Linear(256, 1024), Linear(1024, 1024), Linear(1024, 256), each with a ReLU; a micro-batch is 8 samples, so each activation
or gradient sent between stages is 8 x 256 float32 = 8 KiB. Stage S (with --slow-stage) does N
extra 192x192 matmuls per micro-batch in its forward (inside the module's forward) or in its
backward (an autograd function whose backward does them).

Timers per rank (see _common): "step", "schedule" (schedule.step), "update" (optimizer.step);
per micro-batch "stage_forward" (PipelineStage.forward_one_chunk; "stage": its stage index), "loss" (last stage: the
schedule's loss), "stage_backward" (PipelineStage.backward_one_chunk, which also covers the
first stage, whose input needs no gradient); "p2p_wait" (each schedules._wait_batch_p2p: time
blocked on the sends/recvs); and the checks "module_forward" (forward hooks on the stage module)
and "module_backward" (full backward hooks: they never fire on stage 0).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import _common as C
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining import schedules as S

HIDDEN, WIDTH, MB_SIZE = 256, 1024, 8


class Extra(torch.autograd.Function):
    """Identity forward; a backward that does `n` matmuls of known size first."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, n: int) -> torch.Tensor:
        ctx.n = n
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        C.busy(ctx.n)
        return grad, None


class Stage(nn.Module):
    def __init__(self, extra_forward: int, extra_backward: int) -> None:
        super().__init__()
        self.a = nn.Linear(HIDDEN, WIDTH)
        self.b = nn.Linear(WIDTH, WIDTH)
        self.c = nn.Linear(WIDTH, HIDDEN)
        self.extra_forward, self.extra_backward = extra_forward, extra_backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_forward:
            C.busy(self.extra_forward)
        x = torch.relu(self.a(x))
        if self.extra_backward:
            x = Extra.apply(x, self.extra_backward)
        return torch.relu(self.c(torch.relu(self.b(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved"], default="gpipe")
    parser.add_argument("--virtual", type=int, default=2, help="stages per rank (interleaved)")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--slow-stage", type=int, default=-1)
    parser.add_argument(
        "--slow-virtual",
        type=int,
        default=-1,
        help="(interleaved) the one stage index that is slow",
    )
    parser.add_argument("--slow-phase", choices=["forward", "backward"], default="forward")
    parser.add_argument("--extra", type=int, default=40, help="matmuls per micro-batch")
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    rank, world = C.start()
    slow = rank == args.slow_stage
    multi = args.schedule == "interleaved"
    virtual = args.virtual if multi else 1
    indices = [rank + v * world for v in range(virtual)]
    modules = [
        Stage(
            args.extra if (slow or i == args.slow_virtual) and args.slow_phase == "forward" else 0,
            args.extra if (slow or i == args.slow_virtual) and args.slow_phase == "backward" else 0,
        )
        for i in indices
    ]
    timers = C.Timers()
    mb_index = {"fwd": 0, "bwd": 0}

    # the checks: hooks on the stage module
    def pre(_m: nn.Module, _i: Any) -> None:
        mb_index["fwd_t0"] = time.perf_counter_ns()

    def post(_m: nn.Module, _i: Any, _o: Any) -> None:
        timers.add("module_forward", mb_index["fwd_t0"], time.perf_counter_ns())

    def bpre(_m: nn.Module, _g: Any) -> None:
        mb_index["bwd_t0"] = time.perf_counter_ns()

    def bpost(_m: nn.Module, _gi: Any, _go: Any) -> None:
        timers.add("module_backward", mb_index["bwd_t0"], time.perf_counter_ns())

    for m in modules:
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post)
        m.register_full_backward_pre_hook(bpre)
        m.register_full_backward_hook(bpost)

    n_stages = world * virtual
    stages = [
        PipelineStage(m, i, n_stages, torch.device("cpu"))
        for m, i in zip(modules, indices, strict=True)
    ]
    stage = stages[0]
    if multi:
        schedule = ScheduleInterleaved1F1B(
            stages, args.microbatches, loss_fn=nn.functional.mse_loss
        )
    else:
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
        schedule = kind(stage, args.microbatches, loss_fn=nn.functional.mse_loss)

    # the ground truth: time the schedule's own actions on this stage
    def wrap(obj: Any, attr: str, name: str) -> None:
        inner = getattr(obj, attr)

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return inner(*a, **k)
            finally:
                mb = a[0] if a and isinstance(a[0], int) else None
                timers.add(name, t0, time.perf_counter_ns(), mb, stage=obj.stage_index)

        setattr(obj, attr, timed)

    for st in stages:
        wrap(st, "forward_one_chunk", "stage_forward")
        wrap(st, "backward_one_chunk", "stage_backward")
    inner_loss = schedule._maybe_compute_loss

    def loss(stage_: Any, output: Any, target_mbs: Any, mb: int, *rest: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return inner_loss(stage_, output, target_mbs, mb, *rest)
        finally:
            if stage_.is_last:
                timers.add("loss", t0, time.perf_counter_ns(), mb)

    schedule._maybe_compute_loss = loss  # type: ignore[method-assign]
    inner_wait = S._wait_batch_p2p

    def wait(work: list[dist.Work]) -> None:
        t0 = time.perf_counter_ns()
        inner_wait(work)
        timers.add("p2p_wait", t0, time.perf_counter_ns())

    S._wait_batch_p2p = wait

    optimizer = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.01)
    batch = MB_SIZE * args.microbatches
    x = torch.randn(batch, HIDDEN)
    y = torch.randn(batch, HIDDEN)
    for step in range(args.steps):
        timers.step = step
        with timers.timed("step"):
            optimizer.zero_grad()
            with timers.timed("schedule"):
                first = any(st.is_first for st in stages)
                last = any(st.is_last for st in stages)
                if first and last:
                    schedule.step(x, target=y)
                elif first:
                    schedule.step(x)
                elif last:
                    schedule.step(target=y)
                else:
                    schedule.step()
            with timers.timed("update"):
                optimizer.step()
    groups = [C.group_entry(dist.group.WORLD, None)]
    C.write_truth(
        args.truth,
        f"pipeline-{args.schedule}",
        rank,
        world,
        args,
        groups,
        timers,
        stage=rank,
        stages=world,
        stage_indices=indices,
        microbatches=args.microbatches,
        message_bytes=MB_SIZE * HIDDEN * 4,
    )
    C.finish()


if __name__ == "__main__":
    main()
