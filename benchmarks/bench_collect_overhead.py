"""What `traceview collect` costs a training job outside the profiled window.

Runs benchmarks/timed_train.py (a CPU training loop timing each of its steps) plainly and under
`traceview collect --skip S --warmup W --steps A`, alternating, several times, and compares the
median step time before the window (hooks armed, profiler skipping), inside it, and after it
(the collector idle). Usage:

    python benchmarks/bench_collect_overhead.py [--steps 300] [--repeat 5] [--skip 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=5)
    parser.add_argument(
        "--nvtx", choices=("auto", "on", "off"), default="auto", help="collect's --nvtx"
    )
    args = parser.parse_args()
    extra = ["--nvtx", args.nvtx]
    window_start = args.skip  # the profiler starts when the skipped steps have ended
    window_end = window_start + args.warmup + args.active
    phases: dict[str, dict[str, list[float]]] = {"plain": {}, "collect": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for mode in ("plain", "collect"):
                out = Path(tmp) / f"{mode}-{i}.json"
                train = [sys.executable, str(HERE / "timed_train.py"), str(args.steps), str(out)]
                if mode == "collect":
                    train = [
                        sys.executable, "-m", "traceview", "collect", "-o", str(Path(tmp) / f"run-{i}"), "--no-report", *extra,
                        "--skip", str(args.skip), "--warmup", str(args.warmup), "--steps", str(args.active), "--", *train,
                    ]  # fmt: skip
                run(train)
                times = json.loads(out.read_text())
                for name, part in (
                    ("before the window", times[10:window_start]),
                    ("in the window", times[window_start:window_end]),
                    ("after the window", times[window_end + 2 :]),
                ):
                    phases[mode].setdefault(name, []).extend(part)
    print(f"median step time, {args.repeat} runs of {args.steps} steps each (ms)")
    print(f"{'':20s} {'plain':>8s} {'collect':>8s} {'overhead':>9s}")
    for name in ("before the window", "in the window", "after the window"):
        plain = statistics.median(phases["plain"][name]) * 1e3
        collect = statistics.median(phases["collect"][name]) * 1e3
        print(f"{name:20s} {plain:8.3f} {collect:8.3f} {100 * (collect / plain - 1):8.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
