"""What the Chainer collector's hooks cost a step: hooked against unhooked step time on a model
with thousands of FunctionNodes.

The collector (collectors/rankside_chainer.py, standard library only) is loaded into one
Chainer process, as `traceview collect` loads it, and the same training step (an MLP of
--layers Linear+ReLU layers, --width wide: 4 records per layer and step) runs in alternating
blocks: unhooked (the collector installed, outside its window: what every step outside the
recorded ones pays) and hooked (inside the window: its function hook registered on the thread
and every region recording). Alternating blocks in one process keep the machine's load out of
the comparison as far as it can be: medians of all steps of each kind, and the median of each
block's difference to the block before it (paired). Usage:

    python benchmarks/bench_chainer_overhead.py [--layers 500] [--width 32] [--blocks 30]
        [--steps 2]

Writes --out (benchmarks/results/chainer_overhead.json holds five runs gathered by hand);
needs .venv-chainer (tests/make_envs.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def child(args: argparse.Namespace) -> dict[str, Any]:
    """In the Chainer environment: the alternating blocks."""
    sys.path.insert(0, str(REPO))  # collectors/ as a package: its modules import relatively
    sys.path.insert(0, str(REPO / "tests" / "workloads" / "chainer"))
    import chainer
    import chainer.functions as F
    import numpy as np
    from train import MLP  # type: ignore[import-not-found]

    from collectors import rankside as core  # type: ignore[import-not-found]
    from collectors import rankside_chainer  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        config = core.Config(run_dir=Path(tmp), active=1 << 30, warmup=0, skip=0)
        collector = rankside_chainer.ChainerCollector(config, chainer)
        collector.install()
        model = MLP(args.layers, args.width)
        optimizer = chainer.optimizers.SGD(lr=0.01)
        optimizer.setup(model)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.batch, args.width), dtype=np.float32)
        t = rng.integers(0, 10, args.batch).astype(np.int32)

        def step() -> float:
            start = time.perf_counter()
            loss = F.softmax_cross_entropy(model(x), t)
            model.cleargrads()
            loss.backward()
            optimizer.update()
            return (time.perf_counter() - start) * 1e3

        for _ in range(3):
            step()
        # The window as collect opens it (status, function hook, regions recording), then
        # closed and reopened block by block; no optimizer paces steps (no step markers).
        collector._start()
        collector.pacer = -1
        hooks = chainer.get_function_hooks()
        times: dict[str, list[float]] = {"unhooked": [], "hooked": []}
        records = []
        for _ in range(args.blocks):
            collector.recording = False
            del hooks[rankside_chainer.HOOK_NAME]
            times["unhooked"] += [step() for _ in range(args.steps)]
            hooks[rankside_chainer.HOOK_NAME] = collector.hook
            collector.recording = True
            times["hooked"] += [step() for _ in range(args.steps)]
            records.append(len(collector.events) / args.steps)
            collector.events.clear()
        collector.recording = False
        collector.finished = True
    return {"times": times, "records_per_step": statistics.median(records)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=500)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps", type=int, default=2, help="steps per block")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--python",
        type=Path,
        default=Path(
            os.environ.get("TRACEVIEW_CHAINER_PYTHON", REPO / ".venv-chainer" / "bin" / "python")
        ),
    )
    parser.add_argument("--out", type=Path, default=Path("chainer_overhead.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    command = [str(args.python), __file__, "--child", *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    measured = json.loads(subprocess.run(command, check=True, capture_output=True, env=env).stdout)
    unhooked = statistics.median(measured["times"]["unhooked"])
    hooked = statistics.median(measured["times"]["hooked"])
    # each block's hooked steps against the unhooked steps just before them (load drifts)
    per = args.steps
    pairs = [
        statistics.median(measured["times"]["hooked"][i : i + per])
        - statistics.median(measured["times"]["unhooked"][i : i + per])
        for i in range(0, len(measured["times"]["hooked"]), per)
    ]
    paired = statistics.median(pairs)
    records = measured["records_per_step"]
    result = {
        "what": "median step time inside the collector's window (function hook registered, "
        "regions recording) against outside it (collector installed, idle), alternating "
        "blocks in one Chainer process",
        "model": f"MLP {args.layers} x Linear({args.width},{args.width})+ReLU, batch {args.batch}",
        "records_per_step": records,
        "unhooked_step_ms": round(unhooked, 3),
        "hooked_step_ms": round(hooked, 3),
        "overhead_percent": round(100 * (hooked - unhooked) / unhooked, 2),
        "overhead_us_per_record": round(1e3 * (hooked - unhooked) / records, 3),
        "paired_overhead_ms": round(paired, 3),
        "paired_overhead_percent": round(100 * paired / unhooked, 2),
        "paired_block_differences_ms": [round(p, 2) for p in pairs],
        "steps_each": len(measured["times"]["hooked"]),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", "benchmarks/bench_chainer_overhead.py", *sys.argv[1:]]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
