"""A loop that marks its own steps and phases with traceview's API (and steps no optimizer)."""

from __future__ import annotations

import torch
from torch import nn

import traceview.collectors as tv


def main() -> None:
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    for _ in range(10):
        with tv.phase("data"):
            x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
        with tv.phase("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with tv.phase("backward"):
            loss.backward()
        with tv.phase("optimizer"), torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
        tv.step()
    print("active:", tv.active())


if __name__ == "__main__":
    main()
