"""Multi-rank Kineto traces of a synchronous data-parallel job whose timing is known exactly.

Every rank runs the same loop: load a batch, forward, backward, one all-reduce over gloo (the
training thread launches it with ``c10d::allreduce_`` and blocks; gloo's thread runs it as
``gloo:all_reduce``), then the optimizer update. All ranks start a step together; the all-reduce
ends ``transfer_ms`` after the last rank arrives, so on rank r the wait is exactly
``last arrival - arrival_r`` and the transfer ``transfer_ms``. Each rank's clock can be shifted
by an offset and a linear drift, and each rank's exit from the all-reduce jittered, as the hosts
of a real multi-machine job would record them. The traces are what the PyTorch profiler writes
(the event names, categories and args traceview reads), and nothing else.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

GRADIENT_BYTES = 4 << 20


@dataclass
class Job:
    ranks: int = 3
    steps: int = 40
    io_ms: float = 1.0
    forward_ms: dict[int, float] = field(default_factory=dict)  # rank -> ms (default 10)
    io_extra_ms: dict[int, float] = field(default_factory=dict)  # rank -> extra loading ms
    backward_ms: float = 12.0
    transfer_ms: float = 4.0
    update_ms: float = 1.0
    offset_ms: dict[int, float] = field(default_factory=dict)  # rank -> clock offset
    drift_ppm: dict[int, float] = field(default_factory=dict)  # rank -> clock drift
    exit_jitter_ms: float = 0.0  # each rank leaves the all-reduce up to this much later
    gap_ms: float = 0.1  # between one step's end and the next step's start
    start_us: float = 1.7e15  # the first step, on the true clock (µs since the epoch)
    seed: int = 0

    def forward(self, rank: int) -> float:
        return self.forward_ms.get(rank, 10.0)

    def io(self, rank: int) -> float:
        return self.io_ms + self.io_extra_ms.get(rank, 0.0)

    def arrival(self, rank: int) -> float:
        """ms from the step's start to the rank's arrival at the all-reduce."""
        return self.io(rank) + self.forward(rank) + self.backward_ms

    def wait(self, rank: int) -> float:
        """The rank's wait inside the all-reduce for the last rank, ms per step."""
        return max(self.arrival(r) for r in range(self.ranks)) - self.arrival(rank)


def write(job: Job, out: Path) -> Path:
    """One ``rank-N.pt.trace.json.gz`` per rank in ``out``, on each rank's own clock."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(job.seed)
    exits = [
        [rng.uniform(0, job.exit_jitter_ms) for _ in range(job.ranks)] for _ in range(job.steps)
    ]
    last = max(job.arrival(r) for r in range(job.ranks))  # the last arrival, ms into a step
    for rank in range(job.ranks):
        _write_rank(job, rank, exits, last, out / f"rank-{rank}.pt.trace.json.gz")
    return out


def _write_rank(job: Job, rank: int, exits: list[list[float]], last: float, path: Path) -> None:
    offset_us = job.offset_ms.get(rank, 0.0) * 1e3
    drift = job.drift_ppm.get(rank, 0.0) * 1e-6

    def local(true_ms: float) -> float:
        """A true time (ms after the first step) on this rank's clock, in µs."""
        true_us = true_ms * 1e3
        return job.start_us + true_us + offset_us + drift * true_us

    pid, main, gloo = 1000 + rank, 1000 + rank, 2000 + rank
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": main, "args": {"name": "main"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": gloo, "args": {"name": "gloo"}},
    ]
    ext = 0

    def span(cat: str, name: str, tid: int, start_ms: float, end_ms: float, **args: object) -> None:
        nonlocal ext
        ext += 1
        ts = local(start_ms)
        events.append(
            {
                "ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                "dur": local(end_ms) - ts, "args": {"External id": ext, **args},
            }
        )  # fmt: skip

    t = 0.0  # the step's start, true ms
    for step in range(job.steps):
        arrive = t + job.arrival(rank)
        done = t + last + job.transfer_ms + exits[step][rank]
        end = done + job.update_ms
        span("user_annotation", f"ProfilerStep#{step}", main, t, end)
        io_end = t + job.io(rank)
        span("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter", main, t,
             io_end)  # fmt: skip
        fwd_end = io_end + job.forward(rank)
        span("cpu_op", "aten::linear", main, io_end, fwd_end)
        span("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", main, fwd_end,
             arrive)  # fmt: skip
        span("cpu_op", "c10d::allreduce_", main, arrive, arrive + 0.02)
        span("user_annotation", "gloo:all_reduce", gloo, arrive, done,
             **{"Input type": ["float"], "Input Dims": [[GRADIENT_BYTES // 4]]})  # fmt: skip
        span("user_annotation", "Optimizer.step#SGD.step", main, done, end)
        t = t + last + job.transfer_ms + max(exits[step]) + job.update_ms + job.gap_ms
    trace = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": job.ranks},
        "host_name": f"node{rank}",
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
