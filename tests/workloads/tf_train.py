"""An ordinary TensorFlow training script with no traceview code in it.

--loop custom: MultiWorkerMirroredStrategy over the workers the launcher started (TF_CONFIG is
built from the MPI rank when the script runs under mpirun and TF_CONFIG is not set), a
tf.function step over a tf.data iterator. --loop fit: Keras Model.fit, one process.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=("custom", "fit"), default="custom")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--port", type=int, default=23651)
    args = parser.parse_args()

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    if "TF_CONFIG" in os.environ:  # started by a cluster manager (tf_config_launcher.py)
        config = json.loads(os.environ["TF_CONFIG"])
        rank, world = config["task"]["index"], len(config["cluster"]["worker"])
    elif world > 1:
        workers = [f"127.0.0.1:{args.port + i}" for i in range(world)]
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        )
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    # the strategy first: collective ops must be configured before any tensor exists
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if args.loop == "custom" else None
    x = tf.random.stateless_normal((64 * args.steps, 256), seed=(rank, 1))
    y = tf.random.stateless_uniform((64 * args.steps,), seed=(rank, 2), maxval=10, dtype=tf.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)

    def build() -> tf.keras.Model:
        return tf.keras.Sequential(
            [
                tf.keras.layers.Input((256,)),
                tf.keras.layers.Dense(512, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )

    if args.loop == "fit":
        model = build()
        model.compile(
            optimizer=tf.keras.optimizers.SGD(0.01),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(data, epochs=1, verbose=0)
        return

    assert strategy is not None
    with strategy.scope():
        model = build()
        optimizer = tf.keras.optimizers.SGD(0.01)
    loss_of = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        def step_fn(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_of(yb, model(xb, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(step_fn, args=(xb, yb))

    for xb, yb in data:
        train_step(xb, yb)
    print(f"worker {rank}: {args.steps} steps done", flush=True)


if __name__ == "__main__":
    main()
