"""A training loop whose profile grows fast, with no traceview code in it.

Each step runs --ops tiny tensor operations before its optimizer step (a profiler records
every one of them). --tail SECONDS: after the last step the script goes on running tiny
operations for that long without stepping an optimizer again (an evaluation, or a step that
never ends). --thread: the loop runs on a thread of its own, not the main one. Prints the
process's resident memory growth now and then, and "done" at the end.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
from torch import nn


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
    parser.add_argument("--ops", type=int, default=1000, help="tiny operations per step")
    parser.add_argument("--tail", type=float, default=0.0, help="seconds of work after the steps")
    parser.add_argument(
        "--abort-above", type=int, default=3000, help="exit 3 once grown by this many MiB"
    )
    parser.add_argument("--thread", action="store_true", help="train on another thread")
    args = parser.parse_args()
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
    base, started = rss(), time.monotonic()
    for step in range(args.steps):
        guard(base, args.abort_above)
        for _ in range(args.ops):
            x = x + 1
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        print(
            f"step {step}: {time.monotonic() - started:.2f} s, rss +{(rss() - base) >> 20} MiB",
            flush=True,
        )
    end = time.monotonic() + args.tail
    report = time.monotonic() + 1
    while time.monotonic() < end:
        for _ in range(1000):
            x = x + 1
        guard(base, args.abort_above)
        if time.monotonic() > report:
            report += 1
            print(
                f"tail: {time.monotonic() - started:.2f} s, rss +{(rss() - base) >> 20} MiB",
                flush=True,
            )


if __name__ == "__main__":
    main()
