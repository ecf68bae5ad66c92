"""A small single-process Chainer job for the collector's tests (no traceview import).

    python train.py OUT [--steps N] [--layers L] [--width W] [--no-update] [--fail-at STEP]
                        [--tail SECONDS] [--leak-mb M --pause SECONDS]

Trains an MLP of L hidden layers (Linear W->W + ReLU) with SGD on random data through a
SerialIterator and concat_examples, timing each phase of each iteration (perf_counter) into
OUT/timers.json. ``--no-update`` runs forward and backward but never steps the optimizer;
``--fail-at`` raises an exception in iteration STEP, after its backward; ``--tail`` sleeps
after the last step; ``--leak-mb`` keeps M MiB more every iteration (a growing job, for the
memory cap) and ``--pause`` sleeps that long in each iteration's forward.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import numpy as np  # noqa: E402


class MLP(chainer.ChainList):
    def __init__(self, layers: int, width: int) -> None:
        super().__init__(*(L.Linear(width, width) for _ in range(layers)), L.Linear(width, 10))

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        *hidden, last = self
        for layer in hidden:
            x = F.relu(layer(x))
        return last(x)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--no-update", action="store_true")
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--tail", type=float, default=0, help="seconds of other work at the end")
    parser.add_argument("--leak-mb", type=int, default=0, help="MiB kept every iteration")
    parser.add_argument("--pause", type=float, default=0, help="seconds slept in each forward")
    args = parser.parse_args()
    np.random.seed(0)
    model = MLP(args.layers, args.width)
    optimizer = chainer.optimizers.SGD(lr=0.01)
    optimizer.setup(model)
    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    data = chainer.datasets.TupleDataset(
        rng.standard_normal((n, args.width), dtype=np.float32),
        rng.integers(0, 10, n).astype(np.int32),
    )
    it = chainer.iterators.SerialIterator(data, args.batch, shuffle=False)
    records = []
    kept = []  # --leak-mb
    for i in range(args.steps):
        t0 = time.perf_counter()
        x, t = chainer.dataset.concat_examples(next(it))
        t1 = time.perf_counter()
        loss = F.softmax_cross_entropy(model(x), t)
        if args.leak_mb:
            kept.append(np.ones(args.leak_mb << 17))  # float64: M MiB, every page touched
        time.sleep(args.pause)
        t2 = time.perf_counter()
        model.cleargrads()
        loss.backward()
        t3 = time.perf_counter()
        if args.fail_at == i:
            raise RuntimeError(f"failing on purpose in iteration {i}")
        if not args.no_update:
            optimizer.update()
        t4 = time.perf_counter()
        records.append(
            {
                "iteration": i,
                "data_ms": (t1 - t0) * 1e3,
                "forward_ms": (t2 - t1) * 1e3,
                "backward_ms": (t3 - t2) * 1e3,
                "optimizer_ms": (t4 - t3) * 1e3,
                "step_ms": (t4 - t0) * 1e3,
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timers.json").write_text(json.dumps(records))
    time.sleep(args.tail)  # an evaluation, a checkpoint: no more optimizer steps
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
