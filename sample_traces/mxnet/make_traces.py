"""Make small, real MXNet traces of a distributed CPU training run, with ground truth.

Run under `traceview collect` (which profiles the workers; see make_all.sh):

    traceview collect -o RUN -- traceview-dmlc -n 2 -s 1 PYTHON make_traces.py train dist_sync OUT
    traceview collect -o RUN -- PYTHON make_traces.py train local OUT
    python make_traces.py merge OUT          # timers of every rank -> OUT/groundtruth.json

SCENARIO is one of:
  dist_sync  a parameter-server job: MXNet's ps-lite KVStore ``dist_sync`` with one scheduler,
             one server and two workers (DMLC_ROLE...). Each worker pushes its gradients and
             pulls the weights every step; the server sums the pushes and runs the optimizer
             (update_on_kvstore), so the workers' update is part of the push/pull round.
  dist_overlap  the same job, but Trainer.step follows loss.backward() without waiting for it
             (as training loops usually do): MXNet pushes each layer's gradients as soon as
             backward has computed them, while earlier layers still compute. backward_ms then
             times only the queueing of backward; backward_ms + comm_ms is both together.
  mlp        dist_sync training the PyTorch and TensorFlow samples' model instead (MLP
             512-1024-1024-1024-10, batch 128 per worker, SGD lr 0.01 without momentum, random
             512-float features): the three frameworks' runs of one model, for traceview compare.
  local      one process training on two CPU contexts (cpu(0), cpu(1), half the batch each)
             with the ``local`` KVStore: gradients are summed across the contexts by the
             KVStore (allreduce_grads), then each context updates its weights (update).
  dist_sync_bulk  dist_sync as MXNet runs it by default: bulk execution on (the script leaves
             MXNET_EXEC_BULK_EXEC_TRAIN alone), so that the whole backward pass runs as
             ``ImperativeBulk`` segments; the batches come from an ``mx.io.NDArrayIter`` (the data
             iterator) instead of a Gluon DataLoader.
  dist_overlap_bulk  dist_overlap with bulk execution on and the data iterator: backward's
             segments run between the pushes of the same step.
  local_bulk local with bulk execution on, the data iterator (called as ``it.next()``), and the
             network hybridized (static graph): forward and backward run as a mix of single
             operators and bulk segments.
  memory     dist_sync, but worker 0 (EXTRA_RANK) allocates an extra EXTRA_MIB MiB array in
             forward and frees it after backward (memory ground truth: its peak is EXTRA_MIB
             above worker 1's, in forward or backward).

The other scenarios turn bulk execution off (MXNET_EXEC_BULK_EXEC_TRAIN=0) so that every
operator is timed on its own; they were made that way and their traces stay as they are.

Every phase of every iteration ends with ``mx.nd.waitall()`` so that its perf_counter timer
covers the engine's work for it, not only the Python call that queued it. Each worker writes
OUT/timers-rank-<r>.json; ``merge`` writes OUT/groundtruth.json (format in
sample_traces/README.md). Needs mxnet (1.9.1) and numpy<1.24; not traceview.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

SCENARIOS = (
    "dist_sync", "dist_overlap", "mlp", "local", "dist_sync_bulk", "dist_overlap_bulk", "local_bulk",
    "memory",
)  # fmt: skip
EXTRA_RANK = 0  # memory: the worker that holds an extra array from forward to after backward
EXTRA_MIB = 256
BATCH = 64  # per worker (local: split over the two contexts)
LR = 0.05
MLP_DIMS = (512, 1024, 1024, 1024, 10)  # the PyTorch and TensorFlow samples' model
MLP_BATCH = 128
MLP_LR = 0.01


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


SKIP = _int_env("TRACEVIEW_SKIP", 1)
WARMUP = _int_env("TRACEVIEW_WARMUP", 2)
ACTIVE = _int_env("TRACEVIEW_STEPS", 5)
ITERS = SKIP + WARMUP + ACTIVE + 3  # 3 unprofiled steps after the window, for comparison


def make_net(mx: Any) -> Any:
    net = mx.gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(
            mx.gluon.nn.Conv2D(16, kernel_size=3),
            mx.gluon.nn.BatchNorm(),
            mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.MaxPool2D(pool_size=2),
            mx.gluon.nn.Conv2D(32, kernel_size=3, activation="relu"),
            mx.gluon.nn.MaxPool2D(pool_size=2),
            mx.gluon.nn.Flatten(),
            mx.gluon.nn.Dense(512, activation="relu"),
            mx.gluon.nn.Dense(10),
        )
    return net


def make_mlp(mx: Any) -> Any:
    net = mx.gluon.nn.HybridSequential()
    with net.name_scope():
        for width in MLP_DIMS[1:-1]:
            net.add(mx.gluon.nn.Dense(width, activation="relu"))
        net.add(mx.gluon.nn.Dense(MLP_DIMS[-1]))
    return net


def train(scenario: str, out: Path) -> int:
    bulk = scenario.endswith("_bulk")
    overlap = scenario.removesuffix("_bulk") == "dist_overlap"
    if not bulk:
        os.environ.setdefault("MXNET_EXEC_BULK_EXEC_TRAIN", "0")
    import mxnet as mx  # a scheduler or server runs its loop inside this import and exits
    from mxnet import autograd, gluon, nd

    out.mkdir(parents=True, exist_ok=True)
    distributed = not scenario.startswith("local")
    mlp = scenario == "mlp"
    batch = MLP_BATCH if mlp else BATCH
    if distributed:
        kv = mx.kv.create("dist_sync")
        rank, world = kv.rank, kv.num_workers
        contexts = [mx.cpu(0)]
        trainer_args: dict[str, Any] = {"kvstore": kv}
    else:
        kv = mx.kv.create("local")
        rank, world = 0, 1
        contexts = [mx.cpu(0), mx.cpu(1)]
        trainer_args = {"kvstore": kv, "update_on_kvstore": False}
    mx.random.seed(42)  # identical initial weights everywhere
    net = make_mlp(mx) if mlp else make_net(mx)
    net.initialize(mx.init.Xavier(), ctx=contexts)
    if scenario == "local_bulk":
        net.hybridize(static_alloc=True, static_shape=True)
    optimizer = {"learning_rate": MLP_LR} if mlp else {"learning_rate": LR, "momentum": 0.9}
    trainer = gluon.Trainer(net.collect_params(), "sgd", optimizer, **trainer_args)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    mx.random.seed(1000 + rank)
    n = ITERS * batch
    features = (
        nd.random.normal(shape=(n, MLP_DIMS[0])) if mlp else nd.random.uniform(shape=(n, 1, 28, 28))
    )
    labels = nd.random.randint(0, 10, shape=(n,)).astype("float32")
    if bulk:  # the data iterator: batches sliced from the arrays, no DataLoader
        it: Any = mx.io.NDArrayIter(features, labels, batch_size=batch)
    else:
        data = gluon.data.ArrayDataset(features, labels)
        it = iter(gluon.data.DataLoader(data, batch_size=batch, shuffle=False, num_workers=0))

    ms = 1e3
    records: list[dict[str, Any]] = []
    for i in range(ITERS):
        start_unix_us = time.time_ns() / 1e3
        t0 = time.perf_counter()
        if bulk:  # both spellings of "the next batch", one per scenario
            batch_data = it.next() if scenario == "local_bulk" else next(it)
            x, y = batch_data.data[0], batch_data.label[0]
        else:
            x, y = next(it)
        xs = gluon.utils.split_and_load(x, contexts)
        ys = gluon.utils.split_and_load(y, contexts)
        nd.waitall()
        t1 = time.perf_counter()
        with autograd.record():
            losses = [loss_fn(net(a), b) for a, b in zip(xs, ys, strict=True)]
        extra = (
            nd.zeros(((EXTRA_MIB << 20) // 4,), ctx=contexts[0])  # float32: EXTRA_MIB MiB
            if scenario == "memory" and rank == EXTRA_RANK
            else None
        )
        nd.waitall()
        t2 = time.perf_counter()
        autograd.backward(losses)
        if not overlap:
            nd.waitall()
        del extra  # held from forward to the end of backward
        nd.waitall()
        t3 = time.perf_counter()
        if distributed:
            trainer.step(batch)  # push gradients, the server updates, pull weights
            nd.waitall()
            t4 = t5 = time.perf_counter()
        else:
            trainer.allreduce_grads()  # the local KVStore sums the two contexts' gradients
            nd.waitall()
            t4 = time.perf_counter()
            trainer.update(batch)
            nd.waitall()
            t5 = time.perf_counter()
        step = i - SKIP  # traceview collect names the recorded steps step#WARMUP ...
        records.append(
            {
                "rank": rank,
                "step": step,
                "data_ms": round((t1 - t0) * ms, 4),
                "forward_ms": round((t2 - t1) * ms, 4),
                "backward_ms": round((t3 - t2) * ms, 4),
                "comm_ms": round((t4 - t3) * ms, 4),
                "update_ms": round((t5 - t4) * ms, 4),
                "step_ms": round((t5 - t0) * ms, 4),
                "profiled": WARMUP <= step < WARMUP + ACTIVE,
                "synchronized": not overlap,
                "start_unix_us": round(start_unix_us, 1),
            }
        )
    meta = {
        "scenario": scenario,
        "rank": rank,
        "world_size": world,
        "kvstore": kv.type,
        "batch_size": batch,
        "mxnet_version": mx.__version__,
        "bulk_exec_train": os.environ.get("MXNET_EXEC_BULK_EXEC_TRAIN", "unset (MXNet default: 1)"),
        "params": int(sum(p.data(contexts[0]).size for p in net.collect_params().values())),
    }
    if scenario == "memory":
        meta["extra"] = {
            "rank": EXTRA_RANK,
            "bytes": EXTRA_MIB << 20,
            "held": "allocated in forward (after the model's forward), freed after backward",
        }
    (out / f"timers-rank-{rank}.json").write_text(json.dumps({"meta": meta, "records": records}))
    return 0


DESCRIPTIONS = {
    "dist_sync": {
        "communication": "ps-lite KVStore dist_sync: 1 scheduler, 1 server, 2 workers on 127.0.0.1 "
        "(traceview-dmlc). Trainer.step pushes the gradients and pulls the weights; the server "
        "sums the two workers' pushes and runs SGD (update_on_kvstore), so comm_ms holds the "
        "server's update and update_ms is 0.",
        "launch": "traceview collect -- traceview-dmlc -n 2 -s 1 PYTHON make_traces.py train dist_sync OUT",
    },
    "dist_overlap": {
        "communication": "as dist_sync, but Trainer.step is called right after loss.backward() "
        "without waiting: the pushes of the last layers' gradients overlap the backward of the "
        "first ones. backward_ms only times queueing backward; backward_ms + comm_ms covers both.",
        "launch": "traceview collect -- traceview-dmlc -n 2 -s 1 PYTHON make_traces.py train dist_overlap OUT",
    },
    "mlp": {
        "communication": "as dist_sync (the server runs SGD), for the MLP: 2,634,762 float32 "
        "gradients pushed and weights pulled per step.",
        "launch": "traceview collect -- traceview-dmlc -n 2 -s 1 PYTHON make_traces.py train mlp OUT",
    },
    "local": {
        "communication": "local KVStore over two CPU contexts in one process: "
        "Trainer.allreduce_grads() sums the gradients (KVStoreReduce) and copies them back "
        "(comm_ms); Trainer.update() runs SGD on each context (update_ms).",
        "launch": "traceview collect -- PYTHON make_traces.py train local OUT",
    },
}
DESCRIPTIONS["memory"] = {
    "communication": DESCRIPTIONS["dist_sync"]["communication"]
    + f" Worker {EXTRA_RANK} holds an extra {EXTRA_MIB} MiB array from forward to after backward.",
    "launch": DESCRIPTIONS["dist_sync"]["launch"].replace(" dist_sync ", " memory "),
}
for _name, _how in (
    ("dist_sync", "backward runs as ImperativeBulk segments"),
    ("dist_overlap", "backward runs as ImperativeBulk segments, between the step's pushes"),
    ("local", "network hybridized (static graph): forward and backward run as single operators "
     "and ImperativeBulk segments"),
):  # fmt: skip
    DESCRIPTIONS[f"{_name}_bulk"] = {
        "communication": DESCRIPTIONS[_name]["communication"]
        + f" Bulk execution on (MXNet's default): {_how}; data from mx.io.NDArrayIter.",
        "launch": DESCRIPTIONS[_name]["launch"].replace(f" {_name} ", f" {_name}_bulk "),
    }


def merge(out: Path) -> int:
    parts = [json.loads(p.read_text()) for p in sorted(out.glob("timers-rank-*.json"))]
    if not parts:
        print(f"{out}: no timers-rank-*.json", file=sys.stderr)
        return 2
    scenario = parts[0]["meta"]["scenario"]
    records = sorted((r for p in parts for r in p["records"]), key=lambda r: (r["rank"], r["step"]))
    meta = parts[0]["meta"]
    truth = {
        "scenario": scenario,
        "world_size": meta["world_size"],
        "kvstore": meta["kvstore"],
        "mxnet_version": meta["mxnet_version"],
        "python_version": platform.python_version(),
        "host": platform.node(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": DESCRIPTIONS[scenario]["launch"],
        "model": (
            f"MLP {'-'.join(map(str, MLP_DIMS))} (Dense+ReLU); {meta['params']:,} float32 "
            f"parameters; softmax cross-entropy; SGD lr {MLP_LR}; batch {MLP_BATCH} per worker"
            if scenario == "mlp"
            else "CNN: Conv2D(16,3)+BatchNorm+ReLU, MaxPool, Conv2D(32,3)+ReLU, MaxPool, "
            f"Dense(512)+ReLU, Dense(10); {meta['params']:,} float32 parameters; "
            f"softmax cross-entropy; SGD lr {LR} momentum 0.9; batch {BATCH} per worker"
        ),
        "batch_size": meta.get("batch_size", BATCH),
        "communication": DESCRIPTIONS[scenario]["communication"],
        "data": (
            "mx.io.NDArrayIter over in-memory random 1x28x28 images"
            if scenario.endswith("_bulk")
            else "Gluon DataLoader(num_workers=0) over an in-memory ArrayDataset of random "
            + ("512-float feature vectors" if scenario == "mlp" else "1x28x28 images")
            + " (batchify: nd.stack)"
        ),
        "bulk_exec_train": meta.get("bulk_exec_train"),
        "schedule": {"skip": SKIP, "warmup": WARMUP, "steps": ACTIVE},
        "iterations": ITERS,
        "records": records,
    }
    if "extra" in meta:
        truth["extra"] = meta["extra"]
    (out / "groundtruth.json").write_text(json.dumps(truth, indent=1))
    for part in out.glob("timers-rank-*.json"):
        part.unlink()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "train" and argv[2] in SCENARIOS:
        return train(argv[2], Path(argv[3]))
    if len(argv) == 3 and argv[1] == "merge":
        return merge(Path(argv[2]))
    print(
        f"usage: {argv[0]} train {{{'|'.join(SCENARIOS)}}} OUTDIR  |  {argv[0]} merge OUTDIR",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
