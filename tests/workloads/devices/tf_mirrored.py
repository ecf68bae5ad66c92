"""Data-parallel training on one process's several devices (TensorFlow ``MirroredStrategy`` over
logical CPU devices), one replica slowed.

Each step, every replica: forward and backward of a small Keras MLP on its shard of the batch,
then ``apply_gradients`` all-reduces the gradients across the replicas (``CollectiveReduceV2``)
and updates the mirrored variables. Replica ``--slow`` runs extra layers in its forward.

Ground truth (``--truth FILE``, JSON lines), timed in the job on the host's monotonic clock:
each step's host time (the ``tf.function`` call), and for each replica and step when it reached
the all-reduce (a ``tf.numpy_function`` the replica runs once its gradients are computed; the
gradients passed to ``apply_gradients`` depend on it). ``--profile DIR`` profiles the steps
after ``--warmup`` with ``tf.profiler``, each step marked with a ``Trace(step_num=...)``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--replicas", type=int, default=2)
parser.add_argument("--slow", type=int, default=1)
parser.add_argument("--extra", type=int, default=4, help="extra layers on the slow replica")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--warmup", type=int, default=3)
parser.add_argument("--width", type=int, default=512)
parser.add_argument("--batch", type=int, default=256, help="per replica")
parser.add_argument("--profile", default=None)
parser.add_argument("--truth", default=None)
args = parser.parse_args()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(args.replicas)]
)
devices = [d.name for d in tf.config.list_logical_devices("CPU")]
strategy = tf.distribute.MirroredStrategy(devices)
records: list[dict] = []


def stamp(replica, step, value):
    records.append(
        {"what": "arrive", "device": int(replica), "step": int(step), "ns": time.perf_counter_ns()}
    )
    return np.float32(0.0) * value


with strategy.scope():
    hidden = tf.keras.layers.Dense(args.width, activation="tanh", name="hidden")
    extra = [
        tf.keras.layers.Dense(args.width, activation="tanh", name=f"extra{i}")
        for i in range(args.extra)
    ]
    out = tf.keras.layers.Dense(args.width, name="out")
    optimizer = tf.keras.optimizers.SGD(0.01)
    hidden.build((None, args.width))
    out.build((None, args.width))
    for layer in extra:
        layer.build((None, args.width))

n = args.replicas
x = tf.ones((n * args.batch, args.width))
dataset = tf.data.Dataset.from_tensors((x, x)).repeat()
dataset = dataset.unbatch().batch(n * args.batch)
batches = iter(strategy.experimental_distribute_dataset(dataset))


@tf.function
def train_step(inputs, step):
    def replica_step(batch):
        a, b = batch
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group
        with tf.GradientTape() as tape:
            h = hidden(a)

            def heavy() -> tf.Tensor:
                z = h
                for layer in extra:
                    z = layer(z)
                return h + 1e-9 * z

            h = tf.cond(tf.equal(replica, args.slow), heavy, lambda: h)
            loss = tf.reduce_mean((out(h) - b) ** 2)
        variables = hidden.trainable_variables + out.trainable_variables
        grads = tape.gradient(loss, variables)
        total = tf.add_n([tf.reduce_sum(g) for g in grads])
        zero = tf.numpy_function(stamp, [replica, step, total], tf.float32)
        grads = [g + zero for g in grads]
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    return strategy.run(replica_step, args=(inputs,))


host: list[dict] = []
for i in range(args.warmup + args.steps):
    if i == args.warmup and args.profile:
        tf.profiler.experimental.start(args.profile)
    t0 = time.perf_counter_ns()
    if i >= args.warmup and args.profile:
        with tf.profiler.experimental.Trace("train", step_num=i, _r=1):
            train_step(next(batches), tf.constant(i, tf.int64))
    else:
        train_step(next(batches), tf.constant(i, tf.int64))
    host.append({"what": "step", "step": i, "t0": t0, "t1": time.perf_counter_ns()})
if args.profile:
    tf.profiler.experimental.stop()
if args.truth:
    with open(args.truth, "w") as f:
        for row in host + records:
            f.write(json.dumps({**row, "slow": args.slow, "devices": n}) + "\n")
