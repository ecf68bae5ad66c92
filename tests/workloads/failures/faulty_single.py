"""One TensorFlow or MXNet process that fails on purpose: issue 49's ground truth for the step
record of frameworks other than PyTorch. The fault is at job step --step (the loop's index, from
0); the job writes what it injected to TRUTH/fault.json before it starts.

  python faulty_single.py --framework tf|tf-fit|mxnet --fault KIND [--step K] --truth DIR

Each step takes a batch from the framework's own loader (``tf.data``: a generator; MXNet: a
Gluon DataLoader over a dataset) and trains a small dense model on it (TensorFlow: a tf.function
step, or Keras ``Model.fit`` for ``tf-fit``; MXNet: autograd and a Gluon Trainer).
Faults (KIND):
- hang-io: the batch of step K takes --hang-s (default 600) to load: the job is ended from
  outside (a scheduler's time limit; here ``timeout``);
- raise: the batch of step K raises RuntimeError in the loader.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

BATCH, WIDTH = 16, 32


def _load(index: int, args: argparse.Namespace) -> None:
    """What loading batch ``index`` does besides making it: the fault, at its step."""
    if index != args.step:
        return
    if args.fault == "hang-io":
        time.sleep(args.hang_s)
    elif args.fault == "raise":
        raise RuntimeError(f"injected fault loading the batch of step {index}")


def run_tf(args: argparse.Namespace) -> None:
    import numpy as np
    import tensorflow as tf

    def batches() -> Iterator[tuple[Any, Any]]:
        rng = np.random.default_rng(0)
        for index in range(args.steps):
            _load(index, args)
            yield (
                rng.standard_normal((BATCH, WIDTH)).astype(np.float32),
                rng.integers(0, 10, BATCH).astype(np.int32),
            )

    signature = (
        tf.TensorSpec((BATCH, WIDTH), tf.float32),
        tf.TensorSpec((BATCH,), tf.int32),
    )
    data = tf.data.Dataset.from_generator(batches, output_signature=signature)
    model = tf.keras.Sequential(
        [tf.keras.layers.Input((WIDTH,)), tf.keras.layers.Dense(64, activation="relu"),
         tf.keras.layers.Dense(10)]
    )  # fmt: skip
    loss_of = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.SGD(0.01)
    if args.framework == "tf-fit":
        model.compile(optimizer=optimizer, loss=loss_of)
        model.fit(data, epochs=1, verbose=0)
        return

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_of(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for xb, yb in data:
        train_step(xb, yb)


def run_mxnet(args: argparse.Namespace) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon, nd

    class Batches(gluon.data.Dataset):
        def __len__(self) -> int:
            return args.steps * BATCH

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            if i % BATCH == 0:
                _load(i // BATCH, args)
            return nd.random.normal(shape=(WIDTH,)), nd.array([i % 10])

    mx.random.seed(0)
    net = gluon.nn.Dense(10)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    loss_of = gluon.loss.SoftmaxCrossEntropyLoss()
    for x, y in gluon.data.DataLoader(Batches(), batch_size=BATCH):
        with autograd.record():
            loss = loss_of(net(x), y)
        loss.backward()
        trainer.step(BATCH)
        nd.waitall()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("tf", "tf-fit", "mxnet"), required=True)
    parser.add_argument("--fault", choices=("none", "hang-io", "raise"), required=True)
    parser.add_argument("--step", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hang-s", type=float, default=600.0)
    parser.add_argument("--truth", type=Path, required=True)
    args = parser.parse_args()
    args.truth.mkdir(parents=True, exist_ok=True)
    truth = {"fault": args.fault, "rank": 0, "step": args.step, "world": 1}
    (args.truth / "fault.json").write_text(json.dumps(truth))
    (run_mxnet if args.framework == "mxnet" else run_tf)(args)
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
