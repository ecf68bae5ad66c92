"""What the step record (issue 49) costs a job: per collective call, and per step of a job made
of thousands of small collectives.

Part 1, one process (gloo, world of 1), N calls of ``dist.all_reduce`` on a 4-float tensor, in
blocks of 500 taking turns (median of the blocks): ``plain`` (torch's own function), ``wrapped``
(traceview's wrapper, no record: outside collect's window it only calls through), ``recorded``
(the wrapper writing the step record, as under collect). Also the record's own ``step_end`` and
a phase mark (each DataLoader batch, each torch.save).

Part 2, a real job: ``torchrun --nproc-per-node 2`` of a loop whose steps make --calls small
all-reduces and one small matmul, plain and under `traceview collect` (its steps after the
profiled window: only the record runs), alternating, --repeat times; median step time.

Part 3, the bundled example (examples/train.py: DDP, a DataLoader, steps of a few ms), 2 ranks
under torchrun, plain and under collect, alternating, --repeat times: each step's end timed by
a global optimizer-step hook the runner adds before it runs the script unchanged; median step
time after the profiled window.

    python benchmarks/bench_step_record.py [--calls 1000] [--steps 30] [--repeat 3] [--n 20000]
        [--example-steps 400]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

ONE_PROCESS = r"""
import os, sys, time, json, tempfile, statistics
from pathlib import Path
import torch, torch.distributed as dist
n = int(sys.argv[1])
torch.set_num_threads(1)
store = tempfile.mktemp()
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
from traceview.collectors import rankside_groups
from traceview.collectors.rankside_record import StepRecord
kept = StepRecord(Path(tempfile.mkdtemp()) / "rank-00000")
record = [None]
rankside_groups.install(torch, lambda: record[0])
wrapped = dist.all_reduce
plain = wrapped.__wrapped__
t = torch.ones(4)
for _ in range(2000):
    plain(t)
blocks = {"plain": [], "wrapped": [], "recorded": []}
block = 500
for _ in range(max(n // block, 1)):  # (modes interleaved: the machine's drift cancels)
    for mode in blocks:
        call = plain if mode == "plain" else wrapped
        record[0] = kept if mode == "recorded" else None
        start = time.perf_counter_ns()
        for _ in range(block):
            call(t)
        blocks[mode].append((time.perf_counter_ns() - start) / block / 1e3)
out = {mode: {"per_call_us": statistics.median(v)} for mode, v in blocks.items()}
start = time.perf_counter_ns()
for _ in range(n):
    kept.step_end()
out["recorded"]["step_end_us"] = (time.perf_counter_ns() - start) / n / 1e3
start = time.perf_counter_ns()
for _ in range(n):
    kept.restore(kept.phase(1))
out["recorded"]["phase_us"] = (time.perf_counter_ns() - start) / n / 1e3
print(json.dumps(out))
"""

JOB = r"""
import sys, time, json, torch, torch.distributed as dist
calls, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
dist.init_process_group("gloo")
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
t, x = torch.ones(4), torch.randn(16, 64)
times = []
for _ in range(steps):
    start = time.perf_counter()
    model(x).sum().backward()
    for _ in range(calls):
        dist.all_reduce(t)
    opt.step()
    times.append(time.perf_counter() - start)
if dist.get_rank() == 0:
    json.dump(times, open(out, "w"))
dist.barrier()
dist.destroy_process_group()
"""


#: Runs a script unchanged, timing the end of each optimizer step (rank 0 writes them).
RUNNER = r"""
import json, os, runpy, sys, time
from torch.optim.optimizer import register_optimizer_step_post_hook
ends = []
register_optimizer_step_post_hook(lambda *_: ends.append(time.perf_counter()))
out, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    if os.environ.get("RANK", "0") == "0":
        json.dump([b - a for a, b in zip(ends, ends[1:])], open(out, "w"))
"""


def _median_steps(make: Any, repeat: int, after: int) -> dict[str, float]:
    """Median step time (ms) of runs made by ``make(mode, out_json, index)``, modes taking
    turns; the steps from ``after`` on."""
    medians: dict[str, list[float]] = {"plain": [], "collect": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            for mode in medians:
                out = Path(tmp) / f"{mode}-{i}.json"
                subprocess.run(make(Path(tmp), mode, out, i), check=True, capture_output=True)
                times = json.loads(out.read_text())[after:]
                medians[mode].append(statistics.median(times) * 1e3)
    return {mode: statistics.median(v) for mode, v in medians.items()}


def _under_collect(
    tmp: Path, i: int, cmd: list[str], skip: int, warmup: int, active: int
) -> list[str]:
    return [
        sys.executable, "-m", "traceview", "collect", "-o", str(tmp / f"run-{i}"), "--no-report",
        "--skip", str(skip), "--warmup", str(warmup), "--steps", str(active), "--", *cmd,
    ]  # fmt: skip


def example(steps: int, repeat: int) -> dict[str, float]:
    skip, warmup, active = 5, 1, 2
    script = str(HERE.parent / "examples" / "train.py")

    def make(tmp: Path, mode: str, out: Path, i: int) -> list[str]:
        runner = tmp / "runner.py"
        runner.write_text(RUNNER)
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", str(runner), str(out), script, "--steps", str(steps),
        ]  # fmt: skip
        return _under_collect(tmp, i, cmd, skip, warmup, active) if mode == "collect" else cmd

    return _median_steps(make, repeat, after=skip + warmup + active + 3)


def one_process(n: int) -> dict[str, dict[str, float]]:
    done = subprocess.run(
        [sys.executable, "-c", ONE_PROCESS, str(n)], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def job(calls: int, steps: int, repeat: int) -> dict[str, float]:
    skip, warmup, active = 5, 1, 2

    def make(tmp: Path, mode: str, out: Path, i: int) -> list[str]:
        script = tmp / "job.py"
        script.write_text(JOB)
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", str(script), str(calls), str(steps), str(out),
        ]  # fmt: skip
        return _under_collect(tmp, i, cmd, skip, warmup, active) if mode == "collect" else cmd

    # (the steps after the profiled window and its export)
    return _median_steps(make, repeat, after=skip + warmup + active + 3)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20000, help="calls timed in one process")
    parser.add_argument("--calls", type=int, default=1000, help="all-reduces per step of the job")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--example-steps", type=int, default=400, help="steps of the example")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    started = time.time()
    calls = one_process(args.n)
    base = calls["plain"]["per_call_us"]
    print(f"one process, {args.n} all-reduces of 4 floats (gloo, world of 1), us per call:")
    for mode, got in calls.items():
        extra = got["per_call_us"] - base
        print(f"  {mode:9s} {got['per_call_us']:7.2f}  (+{extra:5.2f})")
    rec = calls["recorded"]
    print(f"  record.step_end {rec['step_end_us']:.2f} us; a phase mark (DataLoader batch) "
          f"{rec['phase_us']:.2f} us")  # fmt: skip
    steps = job(args.calls, args.steps, args.repeat)
    overhead = 100 * (steps["collect"] / steps["plain"] - 1)
    print(
        f"job, 2 ranks, {args.calls} all-reduces a step, median step after the window: "
        f"plain {steps['plain']:.2f} ms, under collect {steps['collect']:.2f} ms ({overhead:+.1f}%)"
    )
    bundled = example(args.example_steps, args.repeat)
    bundled_overhead = 100 * (bundled["collect"] / bundled["plain"] - 1)
    print(
        f"examples/train.py, 2 ranks (DDP), median step after the window: plain "
        f"{bundled['plain']:.2f} ms, under collect {bundled['collect']:.2f} ms "
        f"({bundled_overhead:+.1f}%)"
    )
    if args.json:
        args.json.write_text(json.dumps(
            {"one_process": calls, "job": steps, "calls_per_step": args.calls,
             "overhead_percent": overhead, "example": bundled,
             "example_overhead_percent": bundled_overhead,
             "seconds": time.time() - started}, indent=1
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
