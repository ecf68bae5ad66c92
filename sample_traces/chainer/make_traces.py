"""Make small, real Chainer/ChainerMN traces of a distributed CPU training run, with ground truth.

Run under `traceview collect` (which profiles every rank; see make_all.sh):

    traceview collect -o RUN -- mpirun -np 2 PYTHON make_traces.py mlp OUT

The script is an ordinary ChainerMN job: nothing in it knows about traceview. SCENARIO:
  mlp   the PyTorch, TensorFlow and MXNet samples' model (MLP 512-1024-1024-1024-10, ReLU,
        softmax cross-entropy, SGD lr 0.01, batch 128 per rank, random 512-float features) on 2
        ranks with ChainerMN's ``naive`` communicator: after ``loss.backward()`` an explicit
        ``comm.multi_node_mean_grad(model)`` (one MPI all-reduce per parameter, averaged), then
        ``optimizer.update()``.

Every phase of every iteration is timed with time.perf_counter(); rank 0 writes
OUT/groundtruth.json (format in sample_traces/README.md) after gathering the other ranks'
timers. Needs chainer 7.8.1, mpi4py and numpy<2 (the .venv-chainer environment); not traceview.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # 2 ranks share the 2 cores

import itertools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

DIMS = (512, 1024, 1024, 1024, 10)
BATCH = 128
LR = 0.01


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


SKIP = _int_env("TRACEVIEW_SKIP", 1)
WARMUP = _int_env("TRACEVIEW_WARMUP", 2)
ACTIVE = _int_env("TRACEVIEW_STEPS", 5)
ITERS = SKIP + WARMUP + ACTIVE + 3  # 3 unprofiled steps after the window, for comparison


def make_mlp(chainer: Any) -> Any:
    import chainer.functions as F
    import chainer.links as L

    class MLP(chainer.Chain):
        def __init__(self) -> None:
            super().__init__()
            with self.init_scope():
                self.layers = chainer.ChainList(
                    *(L.Linear(a, b) for a, b in itertools.pairwise(DIMS))
                )

        def forward(self, x: Any) -> Any:
            *hidden, last = self.layers
            for layer in hidden:
                x = F.relu(layer(x))
            return last(x)

    return MLP()


def train(out: Path) -> int:
    import chainer
    import chainer.functions as F
    import chainermn
    import numpy as np

    comm = chainermn.create_communicator("naive")
    rank, world = comm.rank, comm.size
    np.random.seed(42)  # identical initial weights everywhere (and bcast_data makes sure)
    model = make_mlp(chainer)
    comm.bcast_data(model)
    optimizer = chainer.optimizers.SGD(lr=LR)
    optimizer.setup(model)
    rng = np.random.default_rng(1000 + rank)
    n = ITERS * BATCH
    features = rng.standard_normal((n, DIMS[0]), dtype=np.float32)
    labels = rng.integers(0, DIMS[-1], n).astype(np.int32)
    dataset = chainer.datasets.TupleDataset(features, labels)
    it = chainer.iterators.SerialIterator(dataset, BATCH, repeat=True, shuffle=False)

    ms = 1e3
    records: list[dict[str, Any]] = []
    for i in range(ITERS):
        start_unix_us = time.time_ns() / 1e3
        t0 = time.perf_counter()
        x, t = chainer.dataset.concat_examples(next(it))
        t1 = time.perf_counter()
        loss = F.softmax_cross_entropy(model(x), t)
        t2 = time.perf_counter()
        model.cleargrads()
        loss.backward()
        t3 = time.perf_counter()
        comm.multi_node_mean_grad(model)
        t4 = time.perf_counter()
        optimizer.update()
        t5 = time.perf_counter()
        step = i - SKIP  # traceview collect names the recorded steps step#WARMUP ...
        records.append(
            {
                "rank": rank,
                "step": step,
                "data_ms": round((t1 - t0) * ms, 4),
                "forward_ms": round((t2 - t1) * ms, 4),
                "backward_ms": round((t3 - t2) * ms, 4),
                "allreduce_ms": round((t4 - t3) * ms, 4),
                "optimizer_ms": round((t5 - t4) * ms, 4),
                "step_ms": round((t5 - t0) * ms, 4),
                "profiled": WARMUP <= step < WARMUP + ACTIVE,
                "synchronized": True,
                "start_unix_us": round(start_unix_us, 1),
            }
        )
    params = int(sum(p.size for p in model.params()))
    gathered = comm.gather_obj(records)
    if rank != 0:
        return 0
    truth = {
        "scenario": "mlp",
        "world_size": world,
        "communicator": type(comm).__name__,
        "chainer_version": chainer.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "host": platform.node(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "traceview collect -- mpirun --mca mpi_yield_when_idle 1 -np 2 PYTHON "
        "make_traces.py mlp OUT",
        "model": (
            f"MLP {'-'.join(map(str, DIMS))} (Linear+ReLU); {params:,} float32 parameters; "
            f"softmax cross-entropy; SGD lr {LR}; batch {BATCH} per rank"
        ),
        "batch_size": BATCH,
        "communication": "ChainerMN naive communicator: comm.multi_node_mean_grad(model) after "
        "loss.backward(), one MPI all-reduce per parameter (8), averaged; allreduce_ms times it",
        "data": "chainer.iterators.SerialIterator over an in-memory TupleDataset of random "
        "512-float features; chainer.dataset.concat_examples batches them (data_ms)",
        "schedule": {"skip": SKIP, "warmup": WARMUP, "steps": ACTIVE},
        "iterations": ITERS,
        "records": sorted(
            (r for part in gathered for r in part), key=lambda r: (r["rank"], r["step"])
        ),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "groundtruth.json").write_text(json.dumps(truth, indent=1))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "mlp":
        return train(Path(argv[2]))
    print(f"usage: {argv[0]} mlp OUTDIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
