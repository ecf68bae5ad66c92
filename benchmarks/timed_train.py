"""A small CPU training loop that times its own steps (for bench_collect_overhead.py)."""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn


def main() -> None:
    steps = int(sys.argv[1])
    out = sys.argv[2]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    with open(out, "w") as f:
        json.dump(times, f)


if __name__ == "__main__":
    main()
