"""A training script that runs torch.profiler itself (and knows nothing of traceview)."""

from __future__ import annotations

import sys
import tempfile

import torch
from torch import nn


def main() -> None:
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    out = tempfile.mkdtemp(prefix="own-profiler-")
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule,
        on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/mine.json"),
    ) as prof:
        for _ in range(8):
            x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            prof.step()
    print(f"own trace in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
