"""What watching a run costs (issue 51): the step record on the training thread, with 1,024
simulated writers, and `traceview watch --once` on their run directory.

Part 1, the record's cost per step: --writers StepRecords (one per simulated rank, each its own
folder, as under collect) in --procs processes, each process stepping its writers in turn for
--steps steps of --step-ms (sleeping the rest of each step), every step one all-reduce call
(begin and end) and its end; each writer's new rows written back every 0.5 s, as its watchdog
thread does. Timed: the training thread's share (the calls and the step's end, per rank and
step) against the step, and the write-backs (off the training thread) per second. Beside it,
in the same run: the record's earlier form, one ``os.write`` of the row per step (a system
call per step per rank, which a shared file system sees as a write per step).

Part 2, `watch --once --json` on that run directory (its ranks' records as they stand): the
whole command (a new process, as a user runs it), a first look in one process, and a later
look after every rank ran 10 more steps (only what was added is read); beside them
`python -c pass` (the interpreter's start) and reading every record file whole.

    python benchmarks/bench_live.py [--writers 1024] [--procs 8] [--steps 300] [--step-ms 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Process, Queue
from pathlib import Path


def _writers(run: Path, first: int, count: int, steps: int, step_ms: float, out: Queue) -> None:
    from traceview.collectors import rankside_record as W

    records = [W.StepRecord(run / "raw" / f"rank-{r:05d}") for r in range(first, first + count)]
    groups = [rec.group("0") for rec in records]
    op = W.op_index("all_reduce")
    spent, flush_s, flushes = [], 0.0, 0
    flushed_at = time.monotonic()
    for _ in range(steps):
        began = time.perf_counter()
        for rec, group in zip(records, groups, strict=True):
            t0 = time.perf_counter_ns()
            slot = rec.call_begin(op, group, 4096)
            rec.call_end(slot, 0)
            rec.step_end()
            spent.append(time.perf_counter_ns() - t0)
        if time.monotonic() - flushed_at >= W.FLUSH_S:  # (each rank's watchdog does this)
            flushed_at = time.monotonic()
            t0 = time.perf_counter()
            for rec in records:
                rec.flush()
            flush_s += time.perf_counter() - t0
            flushes += len(records)
        left = step_ms / 1e3 - (time.perf_counter() - began)
        if left > 0:
            time.sleep(left)
    # the earlier form: a row appended with one system call per step
    fds = [
        os.open(run / "raw" / f"rank-{r:05d}" / "old.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for r in range(first, first + count)
    ]
    row = W.STEP_ROW.pack(0, 1, 1, 2, 0, 0)
    old = []
    for _ in range(steps):
        for fd in fds:
            t0 = time.perf_counter_ns()
            os.write(fd, row)
            old.append(time.perf_counter_ns() - t0)
    for fd in fds:
        os.close(fd)
        os.unlink(run / "raw" / f"rank-{first + fds.index(fd):05d}" / "old.bin")
    out.put({"spent": spent, "old": old, "flush_s": flush_s, "flushes": flushes})


def record_cost(run: Path, writers: int, procs: int, steps: int, step_ms: float) -> dict:
    queue: Queue = Queue()
    each = writers // procs
    started = time.perf_counter()
    workers = [
        Process(target=_writers, args=(run, i * each, each, steps, step_ms, queue))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    got = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    wall = time.perf_counter() - started
    spent = [t for g in got for t in g["spent"]]
    old = [t for g in got for t in g["old"]]
    return {
        "writers": writers,
        "per_step_us_median": statistics.median(spent) / 1e3,
        "per_step_us_p99": sorted(spent)[int(0.99 * len(spent))] / 1e3,
        "share_of_step_percent": 100 * statistics.median(spent) / 1e3 / (step_ms * 1e3),
        "old_write_us_median": statistics.median(old) / 1e3,
        "writebacks_per_s": sum(g["flushes"] for g in got) / wall,
        "writes_per_s_old_form": writers / (step_ms / 1e3),
        "flush_ms_per_rank": 1e3
        * sum(g["flush_s"] for g in got)
        / max(sum(g["flushes"] for g in got), 1),
    }


def watch_costs(run: Path) -> dict:
    from traceview.runs.live import LiveRun

    # (as a user's installation runs it: its modules compiled once, not at every start)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def timed(argv: list[str]) -> float:
        subprocess.run(argv, check=True, capture_output=True, env=env)  # (compiles, warms)
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, env=env)
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    once = timed([sys.executable, "-m", "traceview", "watch", str(run), "--once", "--json"])
    python = timed([sys.executable, "-c", "pass"])
    t0 = time.perf_counter()
    for path in (run / "raw").rglob("*.bin"):
        path.read_bytes()
    read_all = time.perf_counter() - t0
    live = LiveRun(run)
    t0 = time.perf_counter()
    look = live.snapshot()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    live.snapshot(windows=False)
    again = time.perf_counter() - t0
    return {
        "ranks": len(look.ranks),
        "steps": look.job.steps,
        "watch_once_json_s": once,
        "python_c_pass_s": python,
        "read_every_record_file_s": read_all,
        "first_look_in_process_s": first,
        "later_look_in_process_s": again,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writers", type=int, default=1024)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=3.0)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        run = Path(tmp) / "run"
        cost = record_cost(run, args.writers, args.procs, args.steps, args.step_ms)
        print(
            f"step record, {cost['writers']} simulated ranks, steps of {args.step_ms:g} ms: "
            f"{cost['per_step_us_median']:.2f} us a step on the training thread (p99 "
            f"{cost['per_step_us_p99']:.1f} us): {cost['share_of_step_percent']:.3f}% of the step; "
            f"the earlier form's write alone {cost['old_write_us_median']:.2f} us"
        )
        print(
            f"  write-backs (off the training thread): {cost['writebacks_per_s']:.0f}/s over all "
            f"ranks, {cost['flush_ms_per_rank']:.3f} ms each; a write per step would be "
            f"{cost['writes_per_s_old_form']:.0f}/s"
        )
        (run / "live.json").write_text(json.dumps({"host": "elsewhere", "stall_s": 20}))
        os.sync()  # (the writers' last rows written back: the reader measured alone)
        time.sleep(2)
        costs = watch_costs(run)
        print(
            f"watch --once --json, {costs['ranks']} ranks of {costs['steps']} steps: "
            f"{costs['watch_once_json_s']:.2f} s (python -c pass {costs['python_c_pass_s']:.2f} s; "
            f"reading every record file {costs['read_every_record_file_s']:.2f} s); in one "
            f"process a first look {costs['first_look_in_process_s']:.2f} s, a later one "
            f"{costs['later_look_in_process_s']:.3f} s"
        )
        if args.json:
            args.json.write_text(json.dumps({"record": cost, "watch": costs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
