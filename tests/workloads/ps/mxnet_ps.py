"""An MXNet parameter-server job (ps-lite KVStore) with timers, for traceview's ground truth.

    traceview collect -o RUN -- traceview-dmlc -n 2 -s 1 PYTHON mxnet_ps.py OUT \\
        --kvstore dist_sync --slow-rank 1 --slow-ms 40

Each worker trains a small MLP on random data. ``--slow-rank``'s forward does ``--slow-ms`` of
extra matrix products (real compute, not a sleep). ``--update server`` runs the optimizer on the
servers (gluon's update_on_kvstore), ``worker`` on the workers (the servers only sum);
the workers step with ``gluon.Trainer.step`` (one push-pull per parameter) or, where they update,
``allreduce_grads`` and ``update``. Every phase ends with ``nd.waitall()`` and
is timed with perf_counter; OUT/timers-rank-R.json has each step's ``data_ms``,
``forward_ms``, ``backward_ms``, ``comm_ms`` (push and pull, waits included), ``update_ms``
(the workers' own optimizer step), ``step_ms`` and its start and end (Unix µs), and with
``--step push-pull`` ``push_ms`` (the pushes and a wait for them) and ``pull_ms``. Steps are
numbered as ``traceview collect`` numbers its window (``i - TRACEVIEW_SKIP``). Needs mxnet.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--update", choices=("server", "worker"), default="server")
    parser.add_argument("--steps", type=int, default=0, help="default: the window and 3 more")
    parser.add_argument(
        "--step", choices=("trainer", "push-pull"), default="trainer",
        help="push-pull: the KVStore's own push of every gradient, then pull of every weight "
        "(the optimizer on the servers)",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("MXNET_EXEC_BULK_EXEC_TRAIN", "0")
    import mxnet as mx  # a scheduler or server runs its loop inside this import and exits
    from mxnet import autograd, gluon, nd

    skip = _int_env("TRACEVIEW_SKIP", 1)
    iters = (
        args.steps or skip + _int_env("TRACEVIEW_WARMUP", 2) + _int_env("TRACEVIEW_STEPS", 5) + 3
    )
    kv = mx.kv.create(args.kvstore)
    rank = kv.rank
    if "async" in args.kvstore and args.slow_rank >= 0 and rank != args.slow_rank:
        # nobody waits: the others run on while the slow worker runs its steps (4 of theirs to
        # one of its, at most), so that their updates reach it over its whole run
        iters *= 4
    mx.random.seed(42)
    net = gluon.nn.HybridSequential()
    for inputs, width in ((256, 512), (512, 512), (512, 10)):  # (no deferred initialization)
        net.add(gluon.nn.Dense(width, in_units=inputs, activation="relu" if width != 10 else None))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    on_server = args.update == "server"
    trainer = gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv,
        update_on_kvstore=on_server,
    )  # fmt: skip
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    mx.random.seed(1000 + rank)
    batch = 64
    features = nd.random.normal(shape=(iters * batch, 256))
    labels = nd.random.randint(0, 10, shape=(iters * batch,)).astype("float32")
    loader = iter(
        gluon.data.DataLoader(gluon.data.ArrayDataset(features, labels), batch_size=batch)
    )
    extra_a = nd.random.normal(shape=(256, 256))
    params = list(net.collect_params().values())
    try:
        from traceview.collectors import step as mark_step
    except ImportError:  # (traceview not installed beside MXNet: nothing to mark for)

        def mark_step() -> None:
            pass

    if args.step == "push-pull":  # (the servers run the optimizer on what the workers push)
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01))
        for key, param in enumerate(params):
            kv.init(key, param.data())
    nd.waitall()
    records = []
    ms = 1e3
    for i in range(iters):
        start_us = time.time_ns() / 1e3
        t0 = time.perf_counter()
        x, y = next(loader)
        nd.waitall()
        t1 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        if rank == args.slow_rank:  # extra compute in forward: matrix products for slow_ms
            until = t1 + args.slow_ms / ms
            while time.perf_counter() < until:
                nd.dot(extra_a, extra_a).wait_to_read()
        nd.waitall()
        t2 = time.perf_counter()
        loss.backward()
        nd.waitall()
        t3 = time.perf_counter()
        split: dict[str, float] = {}
        if args.step == "push-pull":
            for key, param in enumerate(params):  # every gradient pushed, then every weight
                kv.push(key, param.grad())
            nd.waitall()  # (a wait after the pushes: where the wait for the slow worker is)
            pushed = time.perf_counter()
            for key, param in enumerate(params):
                kv.pull(key, out=param.data())
            nd.waitall()
            t4 = t5 = time.perf_counter()
            split = {
                "push_ms": round((pushed - t3) * ms, 4),
                "pull_ms": round((t4 - pushed) * ms, 4),
            }
            mark_step()  # (no Trainer.step for collect to see: the script says where steps end)
        elif on_server:
            trainer.step(batch)  # push the gradients, the servers update, pull the weights
            nd.waitall()
            t4 = t5 = time.perf_counter()
        else:
            trainer.allreduce_grads()  # push the gradients, the servers sum, pull the sums
            nd.waitall()
            t4 = time.perf_counter()
            trainer.update(batch)
            nd.waitall()
            t5 = time.perf_counter()
        records.append(
            {
                "rank": rank,
                "step": i - skip,
                "data_ms": round((t1 - t0) * ms, 4),
                "forward_ms": round((t2 - t1) * ms, 4),
                "backward_ms": round((t3 - t2) * ms, 4),
                "comm_ms": round((t4 - t3) * ms, 4),
                "update_ms": round((t5 - t4) * ms, 4),
                "step_ms": round((t5 - t0) * ms, 4),
                "start_unix_us": round(start_us, 1),
                "end_unix_us": round(time.time_ns() / 1e3, 1),
                **split,
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"timers-rank-{rank}.json"
    target.write_text(json.dumps({"kvstore": args.kvstore, "steps": records}))
    kv._barrier() if "sync" in args.kvstore else None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
