"""What MXNet's bulk execution changes in a training job: the reason `traceview collect` leaves
it as the job has it (it used to set MXNET_EXEC_BULK_EXEC_TRAIN=0 for every profiled job).

Runs the MXNet samples' CNN (sample_traces/mxnet/make_traces.py's make_net, batch 64, SGD with
momentum) in one process, unprofiled: 45 iterations of forward, backward and update, each
followed by nd.waitall() and timed with perf_counter (the first 5 left out), once with bulk
execution as MXNet has it by default and once with MXNET_EXEC_BULK_EXEC_TRAIN=0, alternating,
--repeat times. Prints min, p25 and median per phase (ms). Usage:

    python benchmarks/bench_mxnet_bulk.py [--repeat 5] [--python .venv-mxnet/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("forward", "backward", "update", "iteration")

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import mxnet as mx
from mxnet import autograd, gluon, nd
from make_traces import make_net
mx.random.seed(42)
net = make_net(mx)
net.initialize(mx.init.Xavier())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
x = nd.random.uniform(shape=(64, 1, 28, 28))
y = nd.random.randint(0, 10, shape=(64,)).astype("float32")
times = []
for i in range(45):
    t0 = time.perf_counter()
    with autograd.record():
        loss = loss_fn(net(x), y)
    nd.waitall(); t1 = time.perf_counter()
    loss.backward(); nd.waitall(); t2 = time.perf_counter()
    trainer.step(64); nd.waitall(); t3 = time.perf_counter()
    if i >= 5:
        times.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
print(json.dumps(times))
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", default=str(REPO / ".venv-mxnet" / "bin" / "python"))
    args = parser.parse_args()
    samples: dict[str, list[list[float]]] = {"default": [], "off": []}
    for _ in range(args.repeat):
        for mode in samples:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            env.pop("MXNET_EXEC_BULK_EXEC_TRAIN", None)
            if mode == "off":
                env["MXNET_EXEC_BULK_EXEC_TRAIN"] = "0"
            out = subprocess.run(
                [args.python, "-c", CHILD, str(REPO / "sample_traces" / "mxnet")],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
            samples[mode].extend(json.loads(out.strip().splitlines()[-1]))
    print("| bulk execution | phase | n | min ms | p25 ms | median ms |")
    print("|---|---|---|---|---|---|")
    for mode, rows in samples.items():
        for k, phase in enumerate(PHASES):
            v = sorted(r[k] * 1e3 for r in rows)
            label = "MXNet's default (on)" if mode == "default" else "off (=0)"
            print(
                f"| {label} | {phase} | {len(v)} | {v[0]:.2f} | {v[len(v) // 4]:.2f} "
                f"| {statistics.median(v):.2f} |"
            )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
