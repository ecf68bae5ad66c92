"""An MXNet training loop whose profile grows fast, with no traceview code in it.

    PYTHON grow.py [--steps N] [--ops M] [--tail SECONDS]

Each step runs M tiny NDArray operations before its gluon.Trainer step (a profiler records every
one of them). --tail: after the last step the script goes on running tiny operations for that
long without stepping the trainer again (an evaluation). Prints the process's resident memory
growth now and then, and "done" at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import mxnet as mx
from mxnet import autograd, gluon, nd


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def guard(base: int, limit_mib: int) -> None:
    """A safety net for the machine, should the profile not be bounded: exit 3."""
    if rss() - base > limit_mib << 20:
        print(f"grew by more than {limit_mib} MiB: aborting", flush=True)
        os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ops", type=int, default=500, help="tiny operations per step")
    parser.add_argument("--tail", type=float, default=0.0, help="seconds of work after the steps")
    parser.add_argument(
        "--abort-above", type=int, default=3000, help="exit 3 once grown by this many MiB"
    )
    args = parser.parse_args()

    mx.random.seed(0)
    net = gluon.nn.Dense(1)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    x, y = nd.zeros((4, 8)), nd.zeros((8,))
    base, started = rss(), time.monotonic()
    for step in range(args.steps):
        guard(base, args.abort_above)
        for _ in range(args.ops):
            y = y + 1
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(4)
        nd.waitall()
        print(
            f"step {step}: {time.monotonic() - started:.2f} s, rss +{(rss() - base) >> 20} MiB",
            flush=True,
        )
    end = time.monotonic() + args.tail
    report = time.monotonic() + 1
    while time.monotonic() < end:
        for _ in range(500):
            y = y + 1
        y.wait_to_read()
        guard(base, args.abort_above)
        if time.monotonic() > report:
            report += 1
            print(
                f"tail: {time.monotonic() - started:.2f} s, rss +{(rss() - base) >> 20} MiB",
                flush=True,
            )
    print("done", flush=True)


if __name__ == "__main__":
    main()
