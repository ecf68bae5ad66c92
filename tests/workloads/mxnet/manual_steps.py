"""An MXNet training loop without gluon.Trainer that marks its own steps and phases.

    traceview collect -- PYTHON manual_steps.py OUT

A two-layer MLP updated by hand with ``nd.sgd_update``: nothing for traceview's Trainer hook to
see, so the steps come from ``traceview.collectors.step()`` and the phases from ``phase()``.
Every phase ends with ``nd.waitall()`` and is timed; OUT/groundtruth.json has the timers in the
sample traces' format (see sample_traces/README.md). Needs mxnet and traceview installed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import mxnet as mx
from mxnet import autograd, gluon, nd

import traceview.collectors as tv

SKIP, WARMUP, ACTIVE = 1, 2, 5  # traceview collect's defaults
ITERS = SKIP + WARMUP + ACTIVE + 2
BATCH, FEATURES, LR = 128, 512, 0.01


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(7)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(1024, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    params = list(net.collect_params().values())
    records = []
    marked = None  # when the last tv.step() returned: the profiler's step runs mark to mark
    for i in range(ITERS):
        t0 = time.perf_counter()
        with tv.phase("data"):
            x = nd.random.normal(shape=(BATCH, FEATURES))
            y = nd.random.randint(0, 10, shape=(BATCH,)).astype("float32")
            nd.waitall()
        t1 = time.perf_counter()
        with tv.phase("forward"):
            with autograd.record():
                loss = loss_fn(net(x), y)
            nd.waitall()
        t2 = time.perf_counter()
        with tv.phase("backward"):
            loss.backward()
            nd.waitall()
        t3 = time.perf_counter()
        with tv.phase("optimizer"):
            for p in params:
                nd.sgd_update(p.data(), p.grad(), lr=LR, out=p.data())
            nd.waitall()
        t4 = time.perf_counter()
        tv.step()
        began, marked = marked if marked is not None else t0, time.perf_counter()
        step = i - SKIP
        ms = 1e3
        records.append(
            {
                "rank": 0,
                "step": step,
                "data_ms": round((t1 - t0) * ms, 4),
                "forward_ms": round((t2 - t1) * ms, 4),
                "backward_ms": round((t3 - t2) * ms, 4),
                "comm_ms": 0.0,
                "update_ms": round((t4 - t3) * ms, 4),
                # the bookkeeping between two marks (this dict, a pause) is the step's too
                "step_ms": round((marked - began) * ms, 4),
                "profiled": WARMUP <= step < WARMUP + ACTIVE,
            }
        )
    truth = {"scenario": "manual_steps", "active": tv.active(), "records": records}
    (out / "groundtruth.json").write_text(json.dumps(truth, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
