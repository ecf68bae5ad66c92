"""Make small, real TensorFlow profiler traces of a 2-worker CPU training run, with ground truth.

Usage (one process per worker, launched by Open MPI):

    mpirun -np 2 python sample_traces/tensorflow/make_traces.py SCENARIO OUTDIR

Every scenario trains the PyTorch samples' model (MLP 512-1024-1024-1024-10, batch 128 per
worker, SGD) with tf.distribute.MultiWorkerMirroredStrategy over gRPC on 127.0.0.1 (TF_CONFIG is
built from the MPI rank), in a custom training loop. SCENARIO is one of:

  mwms      the usual loop: one tf.function per step runs strategy.run(step_fn), whose
            optimizer.apply_gradients all-reduces the gradients (CollectiveReduceV2).
  explicit  the phases as separate calls, so each has a timer of its own: forward (a
            tf.function under a GradientTape), backward (tape.gradient runs the function's
            gradient), an all-reduce of the gradients (replica_context.all_reduce), and the
            optimizer's update. Communication is fully exposed.
  memory    explicit, with TensorFlow's BFC allocator on for the CPU (the script sets
            TF_CPU_ALLOCATOR_USE_BFC=true itself: without it TensorFlow records no memory on
            CPU), and worker 0 (EXTRA_RANK) holding an extra EXTRA_MIB MiB tensor from before
            forward to after backward (memory ground truth).
  slowio    mwms, but the input pipeline decodes every sample slowly (a py_function that
            sleeps 2 ms, standing in for storage latency, and inflates zlib data): data loading
            dominates.

No pipeline prefetches (tf.data's automatic prefetch injection is turned off), so each step's
data loading happens in its next(iterator) call, where the data timer sees it.

Each worker writes OUTDIR/rank-<r>.xplane.pb (the XSpace tf.profiler wrote, unchanged) and rank 0
writes OUTDIR/groundtruth.json with time.perf_counter() timers for every iteration, in the format
of the PyTorch samples (see sample_traces/README.md).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
import zlib
from itertools import pairwise
from pathlib import Path
from typing import Any

SCENARIOS = {"mwms": 23511, "explicit": 23521, "slowio": 23531, "memory": 23541}  # first port
EXTRA_RANK = 0  # memory: the worker holding an extra tensor through forward and backward
EXTRA_MIB = 256
DIMS = (512, 1024, 1024, 1024, 10)
BATCH = 128
LR = 0.01
WARMUP, ACTIVE, AFTER = 3, 5, 3  # unprofiled steps, profiled steps, unprofiled steps after
SLOW_RAW_BYTES = 512 * 64
SLOW_SLEEP_S = 0.002


def env_int(*names: str, default: int) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in SCENARIOS:
        print(__doc__, file=sys.stderr)
        return 2
    scenario, outdir = argv[1], Path(argv[2])
    rank = env_int("OMPI_COMM_WORLD_RANK", "RANK", default=0)
    world = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
    port = env_int("TRACEVIEW_SAMPLE_PORT", default=SCENARIOS[scenario])
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{port + i}" for i in range(world)]},
            "task": {"type": "worker", "index": rank},
        }
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if scenario == "memory":  # TensorFlow's memory records come from its BFC allocator only
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    outdir.mkdir(parents=True, exist_ok=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        layers = [tf.keras.layers.Input((DIMS[0],))]
        layers += [tf.keras.layers.Dense(d, activation="relu") for d in DIMS[1:-1]]
        layers.append(tf.keras.layers.Dense(DIMS[-1]))
        model = tf.keras.Sequential(layers)
        optimizer = tf.keras.optimizers.SGD(LR)
    loss_of = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    variables = model.trainable_variables

    n = (WARMUP + ACTIVE + AFTER) * BATCH
    x = tf.random.stateless_normal((n, DIMS[0]), seed=(rank, 1))
    y = tf.random.stateless_uniform((n,), seed=(rank, 2), maxval=DIMS[-1], dtype=tf.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if scenario == "slowio":
        rng = tf.random.stateless_uniform(
            (n, SLOW_RAW_BYTES), seed=(rank, 3), maxval=16, dtype=tf.int32
        )
        raw = [zlib.compress(bytes(row)) for row in tf.cast(rng, tf.uint8).numpy()]

        def decode(index: Any) -> Any:
            time.sleep(SLOW_SLEEP_S)
            pixels = zlib.decompress(raw[int(index)])
            return float(sum(pixels[:: len(pixels) // DIMS[0]][: DIMS[0]]))

        data = tf.data.Dataset.range(n).map(
            lambda i: (
                tf.fill((DIMS[0],), tf.py_function(decode, [i], tf.float32)) / 8.0,
                tf.cast(i % DIMS[-1], tf.int32),
            )
        )
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # as written: no prefetch
    iterator = iter(data.batch(BATCH).with_options(options))

    def loss_fn(xb: Any, yb: Any) -> Any:
        per_sample = loss_of(yb, model(xb, training=True))
        return tf.nn.compute_average_loss(per_sample, global_batch_size=BATCH * world)

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        def step_fn(xb: Any, yb: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(xb, yb)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss

        return strategy.run(step_fn, args=(xb, yb))

    @tf.function
    def forward(xb: Any, yb: Any) -> Any:
        return loss_fn(xb, yb)

    @tf.function
    def allreduce(grads: list[Any]) -> Any:
        def fn() -> Any:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, [tf.identity(g) for g in grads])

        return strategy.run(fn)

    @tf.function
    def update(grads: list[Any]) -> None:
        optimizer.apply_gradients(zip(grads, variables, strict=True))

    def now() -> tuple[float, float]:
        """perf_counter for the durations, Unix time (µs) to find the phase in the trace."""
        return time.perf_counter(), time.time_ns() / 1e3

    def iteration(step: int) -> dict[str, Any]:
        marks = {"start": now()}
        xb, yb = next(iterator)
        marks["data"] = now()
        if scenario in ("explicit", "memory"):
            extra = (
                tf.zeros(((EXTRA_MIB << 20) // 4,), tf.float32)  # EXTRA_MIB MiB, held
                if scenario == "memory" and rank == EXTRA_RANK
                else None
            )
            with tf.GradientTape() as tape:
                loss = forward(xb, yb)
            loss.numpy()
            marks["forward"] = now()
            grads = tape.gradient(loss, variables)
            grads[-1].numpy()
            del extra  # freed after backward
            marks["backward"] = now()
            grads = allreduce(grads)
            grads[-1].numpy()
            marks["allreduce"] = now()
            update(grads)
            marks["optimizer"] = now()
        else:
            train_step(xb, yb).numpy()
            marks["train_step"] = now()
        record: dict[str, Any] = {"rank": rank, "step": step}
        names = list(marks)
        for before, name in pairwise(names):
            record[f"{name}_ms"] = round((marks[name][0] - marks[before][0]) * 1e3, 4)
        record["step_ms"] = round((marks[names[-1]][0] - marks["start"][0]) * 1e3, 4)
        record["start_unix_us"] = round(marks["start"][1], 1)
        # each phase's [start, end) in Unix µs, to compare with what the trace shows then
        record["windows_unix_us"] = {
            name: [round(marks[before][1], 1), round(marks[name][1], 1)]
            for before, name in pairwise(names)
        }
        return record

    records = []
    step = 0
    for _ in range(WARMUP):
        records.append({**iteration(step), "profiled": False})
        step += 1
    logdir = Path(tempfile.mkdtemp(prefix=f"tfprof-{rank}-"))
    tf.profiler.experimental.start(str(logdir))
    for _ in range(ACTIVE):
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            record = iteration(step)
        records.append({**record, "profiled": True})
        step += 1
    tf.profiler.experimental.stop()
    for _ in range(AFTER):
        records.append({**iteration(step), "profiled": False})
        step += 1

    (xplane,) = logdir.glob("plugins/profile/*/*.xplane.pb")
    shutil.copyfile(xplane, outdir / f"rank-{rank}.xplane.pb")
    shutil.rmtree(logdir, ignore_errors=True)
    partial = outdir / f".timers-rank-{rank}.json"
    partial.write_text(json.dumps(records))
    if rank == 0:
        parts = [outdir / f".timers-rank-{r}.json" for r in range(world)]
        deadline = time.time() + 120
        while not all(p.exists() for p in parts) and time.time() < deadline:
            time.sleep(0.1)
        gathered = [r for p in parts for r in json.loads(p.read_text())]
        n_params = sum(int(tf.size(v)) for v in variables)
        meta = {
            "scenario": scenario,
            "world_size": world,
            "tensorflow_version": tf.__version__,
            "open_mpi_version": os.environ.get("OMPI_VERSION"),
            "python_version": platform.python_version(),
            "host": platform.node(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": os.environ.get(
                "SAMPLE_TRACE_COMMAND", f"mpirun -np {world} python " + " ".join(argv)
            ),
            "model": (
                f"MLP {'-'.join(map(str, DIMS))} (Dense+ReLU, {n_params} float32 params), "
                f"sparse categorical cross-entropy, SGD lr={LR}, batch {BATCH} per worker, "
                "intra-op threads 1"
            ),
            "communication": (
                "MultiWorkerMirroredStrategy (gRPC ring), explicit replica_context.all_reduce "
                "after backward, timed as allreduce_ms"
                if scenario in ("explicit", "memory")
                else "MultiWorkerMirroredStrategy: optimizer.apply_gradients all-reduces inside "
                "train_step (train_step_ms covers forward, backward, all-reduce and update)"
            ),
            "data": (
                f"tf.data map over a py_function: per sample sleep {SLOW_SLEEP_S * 1e3} ms + "
                f"zlib-inflate {SLOW_RAW_BYTES} B, no prefetch"
                if scenario == "slowio"
                else "tf.data from_tensor_slices(...).batch(128), no prefetch (injection off)"
            ),
            "profiler": {
                "api": "tf.profiler.experimental.start/stop",
                "steps": "Trace('train', step_num=N)",
            },
            "iterations": WARMUP + ACTIVE + AFTER,
            **(
                {
                    "extra": {
                        "rank": EXTRA_RANK,
                        "bytes": EXTRA_MIB << 20,
                        "held": "allocated before forward, freed after backward",
                    },
                    "allocator": "TF_CPU_ALLOCATOR_USE_BFC=true (set by the script)",
                }
                if scenario == "memory"
                else {}
            ),
            "batch_size": BATCH,
            "gradient_bytes": n_params * 4,
            "records": sorted(gathered, key=lambda r: (r["rank"], r["step"])),
        }
        tmp = outdir / "groundtruth.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(outdir / "groundtruth.json")
        for p in parts:
            p.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
