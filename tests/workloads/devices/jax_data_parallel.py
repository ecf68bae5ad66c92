"""Data-parallel training on one process's several devices (JAX, ``pmap``), one device slowed.

Each step: forward and backward of a small MLP on each device's shard of the batch, the
gradients averaged across the devices (``lax.pmean``: an XLA all-reduce), then the SGD update.
Device ``--slow`` does extra work in its forward (inside the loss, so under JAX's ``jvp``).

Ground truth (``--truth FILE``, JSON lines), timed in the job itself on the host's monotonic
clock: each step's host time (the call and ``block_until_ready``), and for each device and step
when it reached the all-reduce (a host callback the device runs just before ``pmean``, ordered
by data dependencies: its gradients and loss in, its result into the all-reduce). A device's wait in a step is the last
device's arrival less its own.

On CPU: ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` gives N devices (set here
from ``--devices`` when unset). ``--profile DIR`` profiles the steps after ``--warmup`` with
``jax.profiler`` (one XSpace per host), each step marked with ``StepTraceAnnotation``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--devices", type=int, default=4)
parser.add_argument("--slow", type=int, default=2, help="the slowed device (-1: none)")
parser.add_argument("--extra", type=int, default=3, help="extra matmuls on the slow device")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--warmup", type=int, default=3)
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--batch", type=int, default=128, help="per device")
parser.add_argument("--profile", default=None)
parser.add_argument("--truth", default=None)
args = parser.parse_args()
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

records: list[dict] = []
n = jax.local_device_count()
assert n == args.devices, (n, args.devices)


def _stamp(what: str):
    def record(device, step, value):
        records.append(
            {"what": what, "device": int(device), "step": int(step), "ns": time.perf_counter_ns()}
        )
        return np.zeros((), np.float32) + 0 * value.astype(np.float32)

    return record


def stamp(what: str, device, step, value):
    """A host callback the device runs when ``value`` is ready; its result feeds what follows."""
    return jax.pure_callback(
        _stamp(what), jax.ShapeDtypeStruct((), jnp.float32), device, step, value
    )


def loss(params, x, y, device):
    w1, w2 = params
    h = jnp.tanh(x @ w1)
    out = h @ w2
    extra = 0.0
    if args.slow >= 0:

        def heavy(z):
            for _ in range(args.extra):
                z = jnp.tanh(z @ w1)
            return jnp.sum(z)

        extra = jax.lax.cond(device == args.slow, heavy, lambda z: 0.0 * jnp.sum(z), h)
        extra = jax.lax.stop_gradient(extra)
    return jnp.mean((out - y) ** 2) + 0.0 * extra


def train_step(params, x, y, step):
    device = jax.lax.axis_index("d")
    value, grads = jax.value_and_grad(loss)(params, x, y, device)
    flat = sum(jnp.sum(g) for g in grads) + 0.0 * value  # (the loss, extra work and all, used)
    arrived = stamp("arrive", device, step, flat)
    grads = [g + arrived for g in grads]
    grads = jax.lax.pmean(grads, "d")
    return [p - 0.01 * g for p, g in zip(params, grads, strict=True)]


step_fn = jax.pmap(train_step, axis_name="d")
key = jax.random.PRNGKey(0)
w = args.width
params = [
    jnp.stack([jax.random.normal(key, (w, w)) * 0.05] * n),
    jnp.stack([jax.random.normal(key, (w, w)) * 0.05] * n),
]
x = jnp.ones((n, args.batch, w))
y = jnp.zeros((n, args.batch, w))
host: list[dict] = []
for i in range(args.warmup + args.steps):
    if i == args.warmup and args.profile:
        jax.profiler.start_trace(args.profile)
    t0 = time.perf_counter_ns()
    if i >= args.warmup and args.profile:
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            params = step_fn(params, x, y, jnp.full((n,), i))
            jax.block_until_ready(params)
    else:
        params = step_fn(params, x, y, jnp.full((n,), i))
        jax.block_until_ready(params)
    host.append({"what": "step", "step": i, "t0": t0, "t1": time.perf_counter_ns()})
if args.profile:
    jax.profiler.stop_trace()
if args.truth:
    with open(args.truth, "w") as f:
        for row in host + records:
            f.write(json.dumps({**row, "slow": args.slow, "devices": n}) + "\n")
