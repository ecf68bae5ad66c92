"""A TensorFlow training loop whose profile grows fast, with no traceview code in it.

Each step (one batch from a tf.data iterator) runs --ops tiny eager operations (a profiler
records every one of them). --tail SECONDS: after the last batch the script goes on running
tiny operations for that long without taking another batch. Prints the process's resident
memory growth now and then, and "done" at the end.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def guard(base: int, limit_mib: int) -> None:
    """A safety net for the machine, should the profile not be bounded: exit 3."""
    if rss() - base > limit_mib << 20:
        print(f"grew by more than {limit_mib} MiB: aborting", flush=True)
        os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ops", type=int, default=500, help="tiny operations per step")
    parser.add_argument("--tail", type=float, default=0.0, help="seconds of work after the steps")
    parser.add_argument(
        "--abort-above", type=int, default=3000, help="exit 3 once grown by this many MiB"
    )
    args = parser.parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    data = tf.data.Dataset.from_tensor_slices(tf.ones((args.steps, 8))).batch(1)
    weights = tf.Variable(tf.zeros((8,)))
    y = tf.zeros((8,))
    base, started = rss(), time.monotonic()
    for step, batch in enumerate(data):
        guard(base, args.abort_above)
        for _ in range(args.ops):
            y = y + 1.0
        weights.assign_sub(0.01 * batch[0])
        print(
            f"step {step}: {time.monotonic() - started:.2f} s, rss +{(rss() - base) >> 20} MiB",
            flush=True,
        )
    end = time.monotonic() + args.tail
    report = time.monotonic() + 1
    while time.monotonic() < end:
        for _ in range(200):
            y = y + 1.0
        guard(base, args.abort_above)
        if time.monotonic() > report:
            report += 1
            print(
                f"tail: {time.monotonic() - started:.2f} s, rss +{(rss() - base) >> 20} MiB",
                flush=True,
            )
    print("done", flush=True)


if __name__ == "__main__":
    main()
