"""What the collector's memory watch (the cap of `collect --max-profile-memory`) costs a job.

One look (pread of /proc/self/statm and a comparison), and a loop of 100,000 tiny PyTorch ops
timed with the watch's thread off and on, alternating, several times. Usage:

    python benchmarks/bench_memory_watch.py [--repeat 7] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from traceview.collectors import rankside


def tiny_ops(n: int = 100_000) -> float:
    x = torch.zeros(8)
    started = time.perf_counter()
    for _ in range(n):
        x = x + 1
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--interval", type=float, default=rankside.WATCH_INTERVAL_S)
    args = parser.parse_args()
    torch.set_num_threads(1)
    watch = rankside.MemoryWatch(1 << 40, lambda first: None)
    assert watch.start(), "no /proc/self/statm"
    n = 20_000
    started = time.perf_counter()
    for _ in range(n):
        _ = watch.resident() > watch.limit
    look = (time.perf_counter() - started) / n
    watch.stop()
    print(f"one look: {look * 1e6:.2f} µs, {look / args.interval * 100:.5f} % of a core")
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.repeat):
        for mode in ("off", "on"):
            running = None
            if mode == "on":
                running = rankside.MemoryWatch(1 << 40, lambda first: None, args.interval)
                running.start()
            times[mode].append(tiny_ops())
            if running is not None:
                running.stop()
    for mode, values in times.items():
        print(f"watch {mode}: median {statistics.median(values):.4f} s of 100,000 tiny ops")
    change = statistics.median(times["on"]) / statistics.median(times["off"]) - 1
    print(f"difference of the medians: {change * 100:+.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
