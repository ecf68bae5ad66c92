#!/usr/bin/env python3
"""The HTML report of an 8-rank and a 1,024-rank run: how large the file is, how long
`traceview report RUN --html` takes to write it, and how long a real browser (Debian's chromium,
headless, through Playwright) takes to open it, side by side with what a user of Holistic Trace
Analysis gets for the same data: a plotly figure of the per-rank breakdown (HTA's figures are
plotly), written self-contained (``include_plotlyjs=True``) so that it too opens offline.

    .venv/bin/python benchmarks/bench_html.py --repeat 5 --json benchmarks/results/html.json

The runs are synthetic data-parallel jobs (tests/synthetic_jobs.py: known phases, one slow
rank), made with the real ingest into bench-data/html-N if missing. Opening is timed from the
navigation's start to the load event (every figure drawn: the page is SVG, drawn as it
parses) and to the first contentful paint, as the browser's own performance entries say; each
repeat opens the file in a fresh page.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = REPO / "bench-data"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def make_run(ranks: int, steps: int) -> Path:
    from tests.synthetic_jobs import Job, write
    from traceview.runs import ingest_run

    run = DATA / f"html-{ranks}"
    if not (run / "manifest.json").exists():
        traces = DATA / f"html-{ranks}-traces"
        write(Job(ranks=ranks, steps=steps, forward_ms={ranks // 3: 14.0}), traces)
        ingest_run([traces], run)
    return run


def write_page(run: Path, out: Path) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "traceview", "report", str(run), "--html", str(out)],
                   check=True, capture_output=True)  # fmt: skip
    return time.perf_counter() - began


def plotly_page(run: Path, out: Path) -> float:
    """HTA's kind of figure for the same run: each rank's step by phase, stacked bars."""
    import plotly.graph_objects as go
    import polars as pl

    began = time.perf_counter()
    steps = pl.read_parquet(run / "steps.parquet")
    phases = ["io", "h2d", "forward", "backward", "update", "comm", "other", "idle"]
    means = steps.group_by("rank").agg(pl.col(f"{p}_ns").mean() / 1e6 for p in phases).sort("rank")
    figure = go.Figure([go.Bar(name=p, x=means["rank"].to_list(), y=means[f"{p}_ns"].to_list())
                        for p in phases])  # fmt: skip
    figure.update_layout(barmode="stack", title="step by phase per rank (ms)")
    figure.write_html(out, include_plotlyjs=True, full_html=True)
    return time.perf_counter() - began


def open_times(browser: object, page_file: Path, repeat: int) -> list[dict[str, float]]:
    out = []
    for _ in range(repeat):
        page = browser.new_page(viewport={"width": 1280, "height": 800})  # type: ignore[attr-defined]
        errors: list[str] = []
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        began = time.perf_counter()
        page.goto(page_file.resolve().as_uri(), wait_until="load")
        wall = time.perf_counter() - began
        entries = page.evaluate(
            """() => ({load: performance.getEntriesByType('navigation')[0].loadEventEnd,
                 paint: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime})"""
        )
        assert not errors, errors
        out.append({"wall_s": wall, "load_ms": entries["load"], "paint_ms": entries["paint"] or 0})
        page.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,1024")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs Debian's chromium (apt-get install chromium)")
    results = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        for ranks in map(int, args.ranks.split(",")):
            run = make_run(ranks, args.steps)
            ours, theirs = DATA / f"html-{ranks}.html", DATA / f"html-{ranks}-plotly.html"
            writes = [write_page(run, ours) for _ in range(args.repeat)]
            plotly_write = plotly_page(run, theirs)
            for tool, path, made in (("traceview report --html", ours, writes),
                                     ("plotly (HTA's figures), one figure", theirs, [plotly_write])):  # fmt: skip
                opened = open_times(browser, path, args.repeat)
                row = {
                    "ranks": ranks, "steps": args.steps, "tool": tool,
                    "bytes": path.stat().st_size,
                    "write_s_median": statistics.median(made),
                    "load_ms_median": statistics.median(o["load_ms"] for o in opened),
                    "load_ms_max": max(o["load_ms"] for o in opened),
                    "paint_ms_median": statistics.median(o["paint_ms"] for o in opened),
                    "open_wall_s_median": statistics.median(o["wall_s"] for o in opened),
                }  # fmt: skip
                results.append(row)
                print(json.dumps(row))
        browser.close()
    if args.json:
        meta = {"machine": platform.machine(), "cpus": __import__("os").cpu_count(),
                "python": platform.python_version(), "repeat": args.repeat}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
