#!/usr/bin/env python3
"""What the TUI timeline costs to open one step of a rank with a big trace: reading the step's
row groups (``Run.window_events``, what the timeline does) against reading all of the rank's
events (what it did before), each followed by cutting the step's lanes.

    .venv/bin/python benchmarks/bench_timeline_step.py [--run RUN] [--target-mb 1000]

Without --run, a one-rank Kineto trace of --target-mb MB is made from the DDP sample with
make_big_trace.py and ingested into bench-data/timeline-<MB>mb-run. Each measurement is a fresh
process (its own imports, a cold Python, the file in the OS cache as a user's second look at
it would find it), for the first, middle and last step; the table gives wall time (open the
run, read, cut lanes; imports excluded) and the child's peak RSS. Results go to
benchmarks/results/timeline_step.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench-data"
RESULTS = REPO / "benchmarks" / "results"


def child(run: str, step: int, mode: str) -> None:
    from traceview.analysis.lanes import rank_lanes, window_read_span, windows_by_step
    from traceview.runs import open_run

    t0 = time.perf_counter()
    with open_run([Path(run)]) as opened:
        windows = windows_by_step(opened.steps)
        span = window_read_span(windows, step, 0)
        assert span is not None
        t1 = time.perf_counter()
        events = opened.window_events(0, *span) if mode == "window" else opened.events([0])
        t2 = time.perf_counter()
        window = windows[step][0] if mode == "window" else None
        lanes = rank_lanes(events, 0, step, opened.manifest.threads().get(0, {}), window=window)
        t3 = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "mode": mode,
                "step": step,
                "rows": events.num_rows,
                "lanes": len(lanes.lanes),
                "open_s": t1 - t0,
                "read_s": t2 - t1,
                "lanes_s": t3 - t2,
                "total_s": t3 - t0,
                "peak_rss_mb": peak_mb,
            }
        )
    )


def make_run(target_mb: int) -> Path:
    run = DATA / f"timeline-{target_mb}mb-run"
    if (run / "manifest.json").exists():
        return run
    traces = DATA / f"timeline-{target_mb}mb"
    traces.mkdir(parents=True, exist_ok=True)
    source = next((REPO / "sample_traces" / "pytorch" / "ddp").glob("rank-0.*"))
    subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "make_big_trace.py"),
            "--source",
            str(source),
            "--target-mb",
            str(target_mb),
            "-o",
            str(traces),
        ],
        check=True,
    )
    subprocess.run(["traceview", "ingest", str(traces), "-o", str(run)], check=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path)
    parser.add_argument("--target-mb", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=3, metavar=("RUN", "STEP", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return
    run = args.run or make_run(args.target_mb)
    from traceview.analysis.lanes import windows_by_step
    from traceview.runs import open_run

    with open_run([run]) as opened:
        steps = sorted(s for s in windows_by_step(opened.steps) if s is not None)
        events_mb = sum(p.stat().st_size for p in (run / "events").rglob("*.parquet")) / 1e6
    picks = sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    rows = []
    for mode in ("window", "all events"):
        for step in picks:
            for _ in range(args.repeat):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(run), str(step), mode],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rows.append(json.loads(out.stdout.splitlines()[-1]))
    RESULTS.mkdir(exist_ok=True)
    meta = {
        "run": str(run.relative_to(REPO)) if run.is_relative_to(REPO) else run.name,
        "steps": len(steps),
        "events_parquet_mb": round(events_mb, 1),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    (RESULTS / "timeline_step.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"One step of a rank: {len(steps)} steps, events Parquet {events_mb:.0f} MB "
        f"(median of {args.repeat} fresh processes)",
        "",
        "| read | step | events read | read s | lanes s | open+read+lanes s | peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in ("window", "all events"):
        for step in picks:
            runs = sorted(
                (r for r in rows if r["mode"] == mode and r["step"] == step),
                key=lambda r: r["total_s"],
            )
            r = runs[len(runs) // 2]
            lines.append(
                f"| {mode} | {step} | {r['rows']:,} | {r['read_s']:.2f} | {r['lanes_s']:.2f} "
                f"| {r['total_s']:.2f} | {r['peak_rss_mb']:.0f} |"
            )
    (RESULTS / "timeline_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
