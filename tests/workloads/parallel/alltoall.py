"""An expert-parallel style exchange with known uneven splits: every step each rank runs a
linear layer, one all_to_all_single of its output whose split sizes it chooses, and an update, under the PyTorch profiler (record_shapes, as
``traceview collect`` records), and writes its trace.

Rank r sends 1 + r + 2*j rows of 64 float32 values to rank j (and so receives 1 + j + 2*r rows
from rank j): the splits, and hence the imbalance, are known from the arguments alone.

    python -m torch.distributed.run --standalone --nproc-per-node 3 alltoall.py OUT --steps 4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

COLUMNS = 64  # float32 values a row


def splits(rank: int, world: int) -> tuple[list[int], list[int]]:
    """(rows sent to each rank, rows received from each rank) on ``rank``."""
    sent = [1 + rank + 2 * j for j in range(world)]
    received = [1 + j + 2 * rank for j in range(world)]
    return sent, received


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sent, received = splits(rank, world)
    layer = torch.nn.Linear(COLUMNS, COLUMNS)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
    tokens = torch.ones(sum(sent), COLUMNS)
    y = torch.empty(sum(received), COLUMNS)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = str(args.out / f"rank-{rank}.pt.trace.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=args.steps),
        on_trace_ready=lambda p: p.export_chrome_trace(trace),
    ) as prof:
        for _ in range(args.steps + 1):  # a layer, its tokens exchanged, its update
            x = layer(tokens)
            dist.all_to_all_single(y, x.detach(), received, sent)
            (x.sum() + y.sum()).backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    dist.barrier()  # (as _common.finish: no rank tears gloo down while a peer works)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
