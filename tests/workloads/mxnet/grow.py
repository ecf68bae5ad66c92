"""An MXNet training loop whose profile grows fast, with no traceview code in it.

    PYTHON grow.py [--steps N] [--ops M] [--tail SECONDS]

Each step runs M tiny NDArray operations before its gluon.Trainer step (a profiler records every
one of them). --tail: after the last step the script goes on running tiny operations for that
long without stepping the trainer again (an evaluation). Prints the process's resident memory
growth now and then, and "done" at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mxnet as mx
from mxnet import autograd, gluon, nd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/workloads: growth.py
from growth import Growth, arguments


def main() -> None:
    args = arguments(default_ops=500)
    mx.random.seed(0)
    net = gluon.nn.Dense(1)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    x, y = nd.zeros((4, 8)), nd.zeros((8,))
    growth = Growth(args.abort_above)
    for step in range(args.steps):
        growth.guard()
        for _ in range(args.ops):
            y = y + 1
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(4)
        nd.waitall()
        growth.say(f"step {step}")

    def work() -> None:
        nonlocal y
        for _ in range(500):
            y = y + 1
        y.wait_to_read()

    growth.tail(args.tail, work)
    print("done", flush=True)


if __name__ == "__main__":
    main()
