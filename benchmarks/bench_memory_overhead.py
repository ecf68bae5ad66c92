"""What recording memory (PyTorch ``profile_memory=True``) costs inside the profiled window.

Runs benchmarks/timed_train.py (a CPU training loop timing each of its steps; the mlp and the cnn
workload) under `traceview collect --memory` and `--no-memory`, alternating, several times, and
compares the median step time of the recorded steps. Usage:

    python benchmarks/bench_memory_overhead.py [--steps 60] [--repeat 4] [--skip 10] [--active 30]
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=30)
    parser.add_argument("--workloads", default="mlp,cnn")
    args = parser.parse_args()
    start = args.skip + args.warmup  # the recorded steps
    end = start + args.active
    print(f"median step time of the {args.active} recorded steps, {args.repeat} runs each (ms)")
    print(f"{'workload':10s} {'no-memory':>10s} {'memory':>10s} {'overhead':>9s}")
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads.split(","):
            times: dict[str, list[float]] = {"--no-memory": [], "--memory": []}
            for i in range(args.repeat):
                for flag in times:
                    out = Path(tmp) / f"{workload}{flag}-{i}.json"
                    cmd = [
                        sys.executable, "-m", "traceview", "collect", flag, "--no-report",
                        "-o", str(Path(tmp) / f"run-{workload}{flag}-{i}"),
                        "--skip", str(args.skip), "--warmup", str(args.warmup),
                        "--steps", str(args.active), "--",
                        sys.executable, str(HERE / "timed_train.py"), str(args.steps), str(out), workload,
                    ]  # fmt: skip
                    subprocess.run(cmd, check=True, capture_output=True)
                    times[flag].extend(json.loads(out.read_text())[start:end])
            plain = statistics.median(times["--no-memory"]) * 1e3
            memory = statistics.median(times["--memory"]) * 1e3
            print(f"{workload:10s} {plain:10.3f} {memory:10.3f} {100 * (memory / plain - 1):8.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
