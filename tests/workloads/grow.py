"""A training loop whose profile grows fast, with no traceview code in it.

Each step runs --ops tiny tensor operations before its optimizer step (a profiler records
every one of them). --tail SECONDS: after the last step the script goes on running tiny
operations for that long without stepping an optimizer again (an evaluation, or a step that
never ends). --thread: the loop runs on a thread of its own, not the main one. Prints the
process's resident memory growth now and then, and "done" at the end.
"""

from __future__ import annotations

import argparse
import threading

import torch
from growth import Growth, arguments
from torch import nn


def main() -> None:
    args = arguments(default_ops=1000, thread=True)
    if args.thread:
        worker = threading.Thread(target=train, args=(args,))
        worker.start()
        worker.join()
    else:
        train(args)
    print("done", flush=True)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.zeros(8)
    growth = Growth(args.abort_above)
    for step in range(args.steps):
        growth.guard()
        for _ in range(args.ops):
            x = x + 1
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        growth.say(f"step {step}")

    def work() -> None:
        nonlocal x
        for _ in range(1000):
            x = x + 1

    growth.tail(args.tail, work)


if __name__ == "__main__":
    main()
