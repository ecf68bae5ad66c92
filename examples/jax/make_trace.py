"""A real trace of a framework traceview has no parser for: JAX on CPU, jax.profiler's Perfetto
JSON, with the training loop's own timers (README "Any other framework"; tests/integration/test_generic_rules.py).

    .venv-jax/bin/python examples/jax/make_trace.py examples/jax     (pip install jax)

Trains the samples' MLP (512-1024-1024-1024-10, batch 128, SGD lr 0.01) with one jitted step
(forward, backward and update in one XLA program). Each of 5 profiled iterations is a
``StepTraceAnnotation("train", step_num=i)`` holding a ``TraceAnnotation("data")`` (a NumPy batch
put on the device) and the jitted step, waited for. Writes OUT/perfetto_trace.json.gz and
OUT/groundtruth.json (perf_counter: data_ms, step_ms per iteration; the versions).
"""

from __future__ import annotations

import itertools
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

DIMS = (512, 1024, 1024, 1024, 10)
BATCH = 128
LR = 0.01


def loss(params: list, x: jax.Array, y: jax.Array) -> jax.Array:
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    logits = x @ w + b
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, DIMS[-1]), axis=-1))


@jax.jit
def step(params: list, x: jax.Array, y: jax.Array) -> list:
    grads = jax.grad(loss)(params, x, y)
    return [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, grads, strict=True)]


def main(out: Path) -> int:
    key = jax.random.PRNGKey(0)
    params = [
        (jax.random.normal(key, (a, b)) * 0.01, jnp.zeros(b)) for a, b in itertools.pairwise(DIMS)
    ]
    rng = np.random.default_rng(0)

    def batch() -> tuple[jax.Array, jax.Array]:
        x = rng.standard_normal((BATCH, DIMS[0]), dtype=np.float32)
        y = rng.integers(0, DIMS[-1], BATCH).astype(np.int32)
        return jax.device_put(x), jax.device_put(y)

    x, y = batch()
    params = jax.block_until_ready(step(params, x, y))  # compiled before the profile
    records = []
    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            for i in range(5):
                t0 = time.perf_counter()
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    with jax.profiler.TraceAnnotation("data"):
                        x, y = jax.block_until_ready(batch())
                    t1 = time.perf_counter()
                    params = jax.block_until_ready(step(params, x, y))
                t2 = time.perf_counter()
                records.append(
                    {
                        "step": i,
                        "data_ms": round((t1 - t0) * 1e3, 4),
                        "compute_ms": round((t2 - t1) * 1e3, 4),
                        "step_ms": round((t2 - t0) * 1e3, 4),
                    }
                )
        (trace,) = Path(logdir).glob("plugins/profile/*/perfetto_trace.json.gz")
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trace, out / "perfetto_trace.json.gz")
    truth = {
        "what": "JAX on CPU, jax.profiler.trace(create_perfetto_trace=True): the samples' MLP, "
        "one jitted SGD step per StepTraceAnnotation('train'), data in TraceAnnotation('data')",
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
        "host": platform.node(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "records": records,
    }
    (out / "groundtruth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
