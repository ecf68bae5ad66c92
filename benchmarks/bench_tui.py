#!/usr/bin/env python3
"""How long `traceview tui RUN` takes to show the overview, for a 2-rank and a 64-rank run.

Each repeat is a fresh Python process that does what the command does, headless (Textual's
``run_test``): import the app, open the run directory in the app's worker, prepare every
screen's rows and draw the overview. The clock starts when the process starts measuring
(before ``traceview`` and Textual are imported) and stops after the first refresh that shows the
run's numbers; the interpreter's own start (before that clock) is reported beside it. After
the overview, the child switches to the timeline and times how long the
lanes of every rank take to be cut in the background (the UI stays responsive meanwhile).

    .venv/bin/python benchmarks/bench_tui.py --repeat 5

The runs are made if missing: the DDP sample ingested into bench-data/tui-ddp-run, and a
64-rank trace set from make_big_trace.py ingested into bench-data/tui-64rank-run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench-data"


def child(run: str, size: tuple[int, int]) -> None:
    """One measurement, printed as a JSON line."""
    t0 = time.perf_counter()
    began = time.time()
    import asyncio

    from traceview.tui.app import TraceviewApp
    from traceview.tui.timeline import Timeline

    imported = time.perf_counter()
    app = TraceviewApp(groups=[[Path(run)]])
    app.animation_level = "none"
    marks: dict[str, float] = {}

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await app.ready.wait()
            marks["ready"] = time.perf_counter()
            drawn = asyncio.Event()

            def on_refresh() -> None:
                marks["overview"] = time.perf_counter()
                drawn.set()

            app.call_after_refresh(on_refresh)
            await drawn.wait()
            verdict = str(app.query_one("#verdict").render())
            assert "bottleneck" in verdict, verdict
            start = time.perf_counter()
            await pilot.press("2")
            timeline = app.query_one(Timeline)
            while timeline.pending:
                await asyncio.sleep(0.005)
            marks["lanes"] = time.perf_counter() - start
            marks["ranks"] = len(timeline.ranks)

    asyncio.run(main())
    print(
        json.dumps(
            {
                "began": began,
                "import_s": imported - t0,
                "overview_s": marks["overview"] - t0,
                "open_and_draw_s": marks["overview"] - imported,
                "lanes_s": marks["lanes"],
                "ranks": marks["ranks"],
            }
        )
    )


def ensure_runs() -> dict[str, Path]:
    """The 2-rank DDP sample and a 64-rank run, as run directories (made once)."""
    python = sys.executable
    ddp = DATA / "tui-ddp-run"
    if not ddp.exists():
        subprocess.run(
            [python, "-m", "traceview", "ingest", str(REPO / "sample_traces/pytorch/ddp"),
             "-o", str(ddp)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    big = DATA / "tui-64rank-run"
    if not big.exists():
        traces = DATA / "tui-64rank-traces"
        if not traces.exists():
            subprocess.run(
                [python, str(REPO / "benchmarks/make_big_trace.py"), "--ranks", "64",
                 "--target-mb", "2", "-o", str(traces)],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        subprocess.run(
            [python, "-m", "traceview", "ingest", str(traces), "-o", str(big)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return {"2 ranks (sample_traces/pytorch/ddp)": ddp, "64 ranks (make_big_trace.py)": big}


def measure(run: Path, size: tuple[int, int]) -> dict[str, float]:
    launched = time.time()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(run), "--size", f"{size[0]}x{size[1]}"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"measurement failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["interpreter_s"] = result.pop("began") - launched  # Python's own start
    result["from_launch_s"] = result["interpreter_s"] + result["overview_s"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--size", default="120x40", help="terminal size (default 120x40)")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    if args.child:
        child(args.child, (width, height))
        return 0

    runs = ensure_runs()
    results: dict[str, list[dict[str, float]]] = {}
    for label, path in runs.items():
        measure(path, (width, height))  # warm the file cache; not counted
        results[label] = [measure(path, (width, height)) for _ in range(args.repeat)]

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    print(
        f"traceview tui, headless {width}x{height}, {args.repeat} fresh processes each; "
        f"seconds, median (min–max); {os.cpu_count()} CPUs, Python {platform.python_version()}\n"
    )
    print("| run | imports | open + first overview | **to the overview** | "
          "with interpreter start | timeline: lanes of every rank |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for label, rows in results.items():
        print(
            f"| {label} | {cell([r['import_s'] for r in rows])} "
            f"| {cell([r['open_and_draw_s'] for r in rows])} "
            f"| **{cell([r['overview_s'] for r in rows])}** "
            f"| {cell([r['from_launch_s'] for r in rows])} "
            f"| {cell([r['lanes_s'] for r in rows])} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"size": args.size, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
