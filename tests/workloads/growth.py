"""What the grow workloads (grow.py, tf_grow.py, mxnet/grow.py) share: their options, the
resident-memory safety net and the progress lines. Standard library only: it runs under every
framework's Python."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable


def arguments(default_ops: int, thread: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ops", type=int, default=default_ops, help="tiny operations per step")
    parser.add_argument("--tail", type=float, default=0.0, help="seconds of work after the steps")
    parser.add_argument(
        "--abort-above", type=int, default=3000, help="exit 3 once grown by this many MiB"
    )
    if thread:
        parser.add_argument("--thread", action="store_true", help="train on another thread")
    return parser.parse_args()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Growth:
    """The process's memory growth since it was made, and the clock since then."""

    def __init__(self, abort_above_mib: int) -> None:
        self.base, self.started, self.limit = rss(), time.monotonic(), abort_above_mib

    def guard(self) -> None:
        """A safety net for the machine, should the profile not be bounded: exit 3."""
        if rss() - self.base > self.limit << 20:
            print(f"grew by more than {self.limit} MiB: aborting", flush=True)
            os._exit(3)

    def say(self, what: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"{what}: {elapsed:.2f} s, rss +{(rss() - self.base) >> 20} MiB", flush=True)

    def tail(self, seconds: float, work: Callable[[], None]) -> None:
        """Run ``work`` (a burst of tiny operations) for ``seconds``, saying so every second."""
        end = time.monotonic() + seconds
        report = time.monotonic() + 1
        while time.monotonic() < end:
            work()
            self.guard()
            if time.monotonic() > report:
                report += 1
                self.say("tail")
