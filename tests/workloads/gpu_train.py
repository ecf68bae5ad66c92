"""A plain training loop on the GPU when there is one (no traceview code in it)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(device)  # fmt: skip
    data = TensorDataset(torch.randn(2048, 3, 64, 64), torch.randint(0, 10, (2048,)))
    loader = DataLoader(data, batch_size=128, pin_memory=device == "cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    print("done on", device)


if __name__ == "__main__":
    main()
