"""A data-parallel job (gloo) that profiles itself in windows and writes one trace file per
window, as users do to keep earlier steps when a job later dies: ``--per cycle`` (a repeating
schedule and ``tensorboard_trace_handler``: one file per profiler cycle) or ``--per step`` (an
``on_trace_ready`` that exports each one-step cycle to a file of its own). Each rank times
every step itself (its work, inside the span the profiler calls ``ProfilerStep#N``, which
ends at ``prof.step()``) into ``timings-RANK.json``, the ground truth.

Run under torchrun: ``python -m torch.distributed.run --nproc-per-node 2 windowed_profile.py
--out DIR --per cycle``; ``--single``: one process without a process group (its traces state no
rank).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per", choices=("cycle", "step"), default="cycle")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--single", action="store_true", help="one process, no process group")
    args = parser.parse_args()
    if not args.single:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if not args.single else 0
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    model: nn.Module = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    if not args.single:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.per == "cycle":  # steps 2-3, 6-7, 10-11: three files a rank
        schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=3)
        # (alone: the handler's own names, host_pid.time.pt.trace.json)
        worker = None if args.single else f"rank{rank}"
        ready = torch.profiler.tensorboard_trace_handler(str(args.out), worker_name=worker)
    else:  # every step a cycle of its own: a file each
        schedule = torch.profiler.schedule(wait=0, warmup=0, active=1)
        exported = itertools.count()

        def ready(prof: torch.profiler.profile) -> None:
            prof.export_chrome_trace(str(args.out / f"rank{rank}-window{next(exported)}.json"))

    spans: list[tuple[int, int]] = []
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule, on_trace_ready=ready
    ) as prof:
        for step in range(args.steps):
            begin = time.perf_counter_ns()
            batch = 128 * (1 + step % 3)  # steps of unequal, known lengths
            x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            spans.append((begin, time.perf_counter_ns()))
            prof.step()  # (ends ProfilerStep#step; exports a finished cycle's trace)
    timings = {str(i): (end - begin) / 1e6 for i, (begin, end) in enumerate(spans)}
    (args.out / f"timings-{rank}.json").write_text(json.dumps(timings))
    if not args.single:
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {rank} pid {os.getpid()} done", flush=True)


if __name__ == "__main__":
    main()
