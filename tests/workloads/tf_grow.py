"""A TensorFlow training loop whose profile grows fast, with no traceview code in it.

Each step (one batch from a tf.data iterator) runs --ops tiny eager operations (a profiler
records every one of them). --tail SECONDS: after the last batch the script goes on running
tiny operations for that long without taking another batch. Prints the process's resident
memory growth now and then, and "done" at the end.
"""

from __future__ import annotations

import os

from growth import Growth, arguments

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    args = arguments(default_ops=500)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    data = tf.data.Dataset.from_tensor_slices(tf.ones((args.steps, 8))).batch(1)
    weights = tf.Variable(tf.zeros((8,)))
    y = tf.zeros((8,))
    growth = Growth(args.abort_above)
    for step, batch in enumerate(data):
        growth.guard()
        for _ in range(args.ops):
            y = y + 1.0
        weights.assign_sub(0.01 * batch[0])
        growth.say(f"step {step}")

    def work() -> None:
        nonlocal y
        for _ in range(200):
            y = y + 1.0

    growth.tail(args.tail, work)
    print("done", flush=True)


if __name__ == "__main__":
    main()
