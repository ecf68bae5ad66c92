"""What the Chainer collector's hooks cost a step: hooked against unhooked step time on a model
with thousands of FunctionNodes.

Runs tests/workloads/chainer/train.py (an MLP of --layers Linear+ReLU layers, --width wide,
which times every iteration) in the Chainer environment plainly and under
`traceview collect --skip S --warmup 0 --steps A`, alternating, --repeat times, and compares the
median time of the same iterations (the recorded window) in both. The window's records per step
come from the trace. Usage:

    python benchmarks/bench_chainer_overhead.py [--layers 500] [--width 32] [--repeat 5]

Writes benchmarks/results/chainer_overhead.json; needs .venv-chainer (tests/make_envs.sh).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKLOAD = REPO / "tests" / "workloads" / "chainer" / "train.py"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=500)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--active", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--python",
        type=Path,
        default=Path(
            os.environ.get("TRACEVIEW_CHAINER_PYTHON", REPO / ".venv-chainer" / "bin" / "python")
        ),
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "chainer_overhead.json")
    args = parser.parse_args()
    steps = args.skip + args.active + 3
    window = slice(args.skip, args.skip + args.active)
    times: dict[str, list[float]] = {"unhooked": [], "hooked": []}
    records_per_step: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for mode in ("unhooked", "hooked"):
                out = Path(tmp) / f"{mode}-{i}"
                train = [
                    str(args.python), str(WORKLOAD), str(out), "--steps", str(steps),
                    "--layers", str(args.layers), "--width", str(args.width),
                    "--batch", str(args.batch),
                ]  # fmt: skip
                if mode == "hooked":
                    run = Path(tmp) / f"run-{i}"
                    train = [
                        sys.executable, "-m", "traceview", "collect", "--no-report", "-o", str(run),
                        "--skip", str(args.skip), "--warmup", "0", "--steps", str(args.active),
                        "--", *train,
                    ]  # fmt: skip
                subprocess.run(train, check=True, capture_output=True)
                timers = json.loads((out / "timers.json").read_text())
                times[mode] += [r["step_ms"] for r in timers[window]]
                if mode == "hooked":
                    trace = next(run.glob("raw/rank-*/rank-*.chainer.json.gz"))
                    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
                    nodes = sum(1 for e in events if e.get("cat") in ("forward", "backward"))
                    records_per_step.append(nodes / args.active)
    unhooked, hooked = statistics.median(times["unhooked"]), statistics.median(times["hooked"])
    nodes = statistics.median(records_per_step)
    result = {
        "what": "median step time of the recorded iterations, hooked (traceview collect) "
        "against unhooked (the same script, plain)",
        "model": f"MLP {args.layers} x Linear({args.width},{args.width})+ReLU, batch {args.batch}",
        "function_node_records_per_step": nodes,
        "unhooked_step_ms": round(unhooked, 3),
        "hooked_step_ms": round(hooked, 3),
        "overhead_percent": round(100 * (hooked - unhooked) / unhooked, 2),
        "overhead_us_per_record": round(1e3 * (hooked - unhooked) / nodes, 2),
        "runs": args.repeat,
        "steps_per_run": args.active,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
