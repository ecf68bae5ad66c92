"""A TensorFlow parameter-server job (``ParameterServerStrategy`` with a ``ClusterCoordinator``)
with timers, for traceview's ground truth. One host, every task its own process:

    python tf_ps.py OUT --workers 2 --ps 1 --slow-worker 1 --slow-ms 30 --steps 40

The chief (the coordinator) schedules ``--steps`` closures; each runs one training step of a
small MLP on whichever worker is free, its variables on the parameter servers. The slow worker
does ``--slow-ms`` (about) of extra matrix products in its forward (real compute). Every worker
and parameter server runs TensorFlow's profiler service; the chief profiles itself and, over the
same time, every other task through that service (``tf.profiler.experimental.client.trace``),
so OUT/profile holds one ``.xplane.pb`` per task: ``chief.xplane.pb`` and the others as the
profiler names them (``<host>_<port>.xplane.pb``): nothing in a name says the role.

OUT/timers.json: for each closure, the worker that ran it (``worker``, its task index) and its
start on that worker (``t0_us``, Unix µs: a ``tf.timestamp`` at the step's start), when the
parameter server had applied its update (``updated_us``, a ``tf.timestamp`` placed on the
server after it) and when the worker had the server's answer back (``t1_us``), in the order
they were scheduled. Needs tensorflow.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_ports(n: int) -> list[int]:
    """n ports free now (held together while chosen, so that they differ)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


WORKER_ID = "worker_id.txt"


def launch(args: argparse.Namespace) -> int:
    """Start the parameter servers and workers, then the chief; stop the others when it ends."""
    ports = free_ports(2 * (args.workers + args.ps) + 1)
    grpc, profiler = ports[: args.workers + args.ps + 1], ports[args.workers + args.ps + 1 :]
    cluster = {
        "chief": [f"127.0.0.1:{grpc[0]}"],
        "worker": [f"127.0.0.1:{p}" for p in grpc[1 : 1 + args.workers]],
        "ps": [f"127.0.0.1:{p}" for p in grpc[1 + args.workers :]],
    }
    services = {"worker": profiler[: args.workers], "ps": profiler[args.workers :]}
    tasks = [("ps", i) for i in range(args.ps)] + [("worker", i) for i in range(args.workers)]
    others = []
    for kind, index in tasks:
        env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": index}}
        ))  # fmt: skip
        if args.profile:
            env["TF_PS_PROFILER_PORT"] = str(services[kind][index])
        home = args.out / "tasks" / f"{kind}-{index}"
        home.mkdir(parents=True, exist_ok=True)
        (home / WORKER_ID).write_text(str(index if kind == "worker" else -1))
        command = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--task"]
        others.append(subprocess.Popen(command, env=env, cwd=home))
    env = dict(
        os.environ,
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}),
    )
    env["TF_PS_SERVICES"] = ",".join(f"grpc://127.0.0.1:{p}" for p in profiler)
    chief = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--task"], env=env)
    try:
        return chief.wait(timeout=600)
    finally:
        for p in others:
            p.terminate()
        for p in others:
            p.wait(timeout=30)


def serve() -> int:
    """A worker or parameter server: the profiler service, then the task's gRPC server."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if os.environ.get("TF_PS_PROFILER_PORT"):  # (not under traceview collect: it does this)
        tf.profiler.experimental.server.start(int(os.environ["TF_PS_PROFILER_PORT"]))
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
        protocol="grpc", start=True,
    )  # fmt: skip
    server.join()
    return 0


def coordinate(args: argparse.Namespace) -> int:
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w1 = tf.Variable(tf.random.normal((256, args.width), seed=1) * 0.05)
        w2 = tf.Variable(tf.random.normal((args.width, 10), seed=2) * 0.05)
        heavy = tf.Variable(tf.random.normal((args.width, args.width), seed=3) * 0.01)
        opt = tf.keras.optimizers.SGD(0.01)

    def dataset_fn() -> tf.data.Dataset:
        x = tf.random.normal((args.batch * 8, 256))
        y = tf.random.uniform((args.batch * 8,), 0, 10, tf.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch)

    per_worker = iter(coordinator.create_per_worker_dataset(dataset_fn))
    # (about 1.5 ms a 512x512 product on 64 rows, on one of this machine's cores)
    extra = max(1, round(args.slow_ms / (1.5 * args.batch / 64 * (args.width / 512) ** 2)))

    @tf.function
    def step(iterator):  # type: ignore[no-untyped-def]
        def train(x, y):  # type: ignore[no-untyped-def]
            # (which worker runs it: a file in the worker process's own directory)
            wid = tf.strings.to_number(tf.io.read_file(WORKER_ID), tf.int32)
            t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                x = tf.identity(x)
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x, w1))

                def slow() -> tf.Tensor:
                    out = h
                    for _ in range(extra):
                        out = tf.matmul(out, heavy)
                    return h + 0.0 * out

                h = tf.cond(tf.equal(wid, args.slow_worker), slow, lambda: h)
                logits = tf.matmul(h, w2)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            grads = tape.gradient(loss, [w1, w2])
            opt.apply_gradients(zip(grads, [w1, w2], strict=True))
            with tf.device(w1.device):  # (on the parameter server, after its update: the reads
                # of a variable are ordered after its assignments)
                updated = tf.reduce_sum(w1.read_value()) + tf.reduce_sum(w2.read_value())
                with tf.control_dependencies([updated]):
                    t2 = tf.timestamp()
            with tf.control_dependencies([*grads, loss, t2]):
                t1 = tf.timestamp()  # (on the worker, once the server's answer is back)
            return wid, t0, t1, t2

        x, y = next(iterator)
        return strategy.run(train, args=(x, y))

    if not args.profile:  # (under traceview collect, which profiles every task itself)
        results = [coordinator.schedule(step, args=(per_worker,)) for _ in range(args.steps)]
        coordinator.join()
        _write_timers(args.out, results)
        return 0
    for _ in range(3):  # (tracing and the first steps, outside the profile)
        coordinator.schedule(step, args=(per_worker,))
    coordinator.join()
    profile = args.out / "profile"
    staging = args.out / "staging"
    services = os.environ["TF_PS_SERVICES"]
    window_ms = int(args.window_s * 1000)
    traced = threading.Thread(
        target=tf.profiler.experimental.client.trace,
        args=(services, str(staging / "others"), window_ms),
    )
    traced.start()
    time.sleep(0.5)  # (the services start tracing)
    tf.profiler.experimental.start(str(staging / "chief"))
    results = [coordinator.schedule(step, args=(per_worker,)) for _ in range(args.steps)]
    coordinator.join()
    tf.profiler.experimental.stop()
    traced.join()
    profile.mkdir(parents=True, exist_ok=True)
    for found in staging.rglob("*.xplane.pb"):
        name = "chief.xplane.pb" if "chief" in found.parts else found.name
        shutil.move(str(found), profile / name)
    shutil.rmtree(staging)
    _write_timers(args.out, results)
    return 0


def _write_timers(out: Path, results: list) -> None:  # type: ignore[type-arg]
    timers = []
    for result in results:
        wid, t0, t1, t2 = result.fetch()
        timers.append({"worker": int(wid), "t0_us": float(t0) * 1e6, "t1_us": float(t1) * 1e6,
                       "updated_us": float(t2) * 1e6})  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "timers.json").write_text(json.dumps(timers))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--slow-worker", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512, help="the hidden layer")
    parser.add_argument("--window-s", type=float, default=6.0, help="the other tasks' profile")
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false",
        help="profile nothing (under traceview collect, which profiles every task)",
    )  # fmt: skip
    parser.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.task:
        return launch(args)
    kind = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
    return coordinate(args) if kind == "chief" else serve()


if __name__ == "__main__":
    sys.exit(main())
