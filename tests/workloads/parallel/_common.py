"""What the parallel jobs share: gloo start-up under torchrun, timers, the truth file.

Each job writes TRUTH_DIR/rank<R>.json on every rank (TRUTH_DIR: its --truth argument):

  {"job", "rank", "world", "args", "clock": {"perf_counter_ns", "monotonic_ns", "time_ns"},
   "groups": [{"name", "desc", "dim", "ranks"}],   # as the job built them (its own objects)
   "timers": [{"name", "step", "mb", "t0_ns", "t1_ns"}], ...}

Timers use time.perf_counter_ns() (CLOCK_MONOTONIC on Linux); "clock" reads the three clocks
together once so a reader can place the timers on the trace's clock. Timer names: "step" (the
whole iteration), "forward", "backward", "update", and per job more (see each job).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def start() -> tuple[int, int]:
    """gloo on CPU, one intra-op thread (two shared cores); rank and world from torchrun."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def finish() -> None:
    """Every rank at a barrier, then the group destroyed: a rank that tears gloo down while a
    peer still works (writing its truth) can make that peer abort at exit (SIGABRT,
    "terminate called without an active exception"), about once in a full test run."""
    dist.barrier()
    dist.destroy_process_group()


def group_entry(group: Any, dim: str | None) -> dict[str, Any]:
    """One process group as the job built it: its name, description and ranks from torch."""
    return {
        "name": group.group_name,
        "desc": getattr(group, "group_desc", None),
        "dim": dim,
        "ranks": dist.get_process_group_ranks(group),
    }


PHASES = ("forward", "backward", "update")


class Timers:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.step = -1
        self.phase = "outside"  # the phase a "call" row is issued in

    def add(self, name: str, t0: int, t1: int, mb: int | None = None, **extra: Any) -> None:
        self.rows.append(
            {"name": name, "step": self.step, "mb": mb, "t0_ns": t0, "t1_ns": t1, **extra}
        )

    def timed(self, name: str, mb: int | None = None) -> _Span:
        return _Span(self, name, mb)


class _Span:
    def __init__(self, timers: Timers, name: str, mb: int | None) -> None:
        self.timers, self.name, self.mb = timers, name, mb

    def __enter__(self) -> None:
        if self.name in PHASES:
            self.timers.phase = self.name
        self.t0 = time.perf_counter_ns()

    def __exit__(self, *_: object) -> None:
        self.timers.add(self.name, self.t0, time.perf_counter_ns(), self.mb)
        if self.name in PHASES:
            self.timers.phase = "outside"


def record_collectives(timers: Timers) -> None:
    """Rows "call" for every collective FSDP2 and DTensor issue (they look the entry points up on
    their modules at call time): op (events.collective names), group (its name), bytes (the
    input's), phase (the job's phase when issued), t0/t1 around the call (an async call returns
    once queued)."""
    import torch.distributed._functional_collectives as funcol

    def wrap(module: Any, attr: str, op: str, tensor_arg: int, tensor_kw: str) -> None:
        inner = getattr(module, attr)

        def call(*a: Any, **k: Any) -> Any:
            group = k.get("group")
            if module is funcol:
                group = funcol._resolve_group_name(group if group is not None else a[2])
            else:
                group = (group or dist.group.WORLD).group_name
            tensor = k[tensor_kw] if tensor_kw in k else a[tensor_arg]
            t0 = time.perf_counter_ns()
            try:
                return inner(*a, **k)
            finally:
                timers.add(
                    "call", t0, time.perf_counter_ns(), op=op, group=str(group),
                    bytes=tensor.nbytes, phase=timers.phase,
                )  # fmt: skip

        setattr(module, attr, call)

    wrap(dist, "all_gather_single", "allgather", 1, "input_tensor")
    wrap(dist, "reduce_scatter_single", "reduce_scatter", 1, "input")
    wrap(dist, "all_reduce", "allreduce", 0, "tensor")
    wrap(funcol, "all_reduce", "allreduce", 0, "self")
    wrap(funcol, "all_gather_tensor", "allgather", 0, "self")
    wrap(funcol, "reduce_scatter_tensor", "reduce_scatter", 0, "self")


def write_truth(
    truth: str,
    job: str,
    rank: int,
    world: int,
    args: Any,
    groups: list[dict[str, Any]],
    timers: Timers,
    **extra: Any,
) -> None:
    clock = {
        "perf_counter_ns": time.perf_counter_ns(),
        "monotonic_ns": time.monotonic_ns(),
        "time_ns": time.time_ns(),
    }
    out = Path(truth)
    out.mkdir(parents=True, exist_ok=True)
    body = {
        "job": job,
        "rank": rank,
        "world": world,
        "pid": os.getpid(),
        "args": vars(args),
        "clock": clock,
        "groups": groups,
        "timers": timers.rows,
        **extra,
    }
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(out / f"rank{rank}.json")


class SleepInBackward(torch.autograd.Function):
    """Identity forward; a backward that first sleeps ``ms`` inside
    record_function("extra_backward") (an operator of the backward pass in the trace), timed as
    "extra" on ``timers``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float, timers: Timers) -> torch.Tensor:
        ctx.ms, ctx.timers = ms, timers
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.ms > 0:
            with torch.profiler.record_function("extra_backward"), ctx.timers.timed("extra"):
                time.sleep(ctx.ms / 1000)
        return grad, None, None


def busy(n: int, size: int = 192) -> None:
    """Known extra work: n matmuls of two size x size matrices, outside autograd."""
    with torch.no_grad():
        a = torch.ones(size, size)
        for _ in range(n):
            a = torch.mm(a, a) * (1.0 / size)
