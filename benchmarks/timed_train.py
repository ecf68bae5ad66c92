"""A small CPU training loop that times its own steps (for bench_collect_overhead.py and
bench_memory_overhead.py): ``timed_train.py STEPS OUT [mlp|cnn]`` (default mlp; cnn: a small
convolutional network, many more allocations per step)."""

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
    model: nn.Module
    if len(sys.argv) > 3 and sys.argv[3] == "cnn":
        model = nn.Sequential(
            *(m for _ in range(4) for m in (nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())),
            nn.Flatten(),
            nn.Linear(16 * 16 * 16, 10),
        )  # fmt: skip
        x = torch.randn(32, 16, 16, 16)
    else:
        model = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        x = torch.randn(64, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    y = torch.randint(0, 10, (len(x),))
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
