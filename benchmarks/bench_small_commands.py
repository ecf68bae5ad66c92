#!/usr/bin/env python3
"""What a user waits for on everyday traces: `traceview ingest` and `traceview report --json`
of small sample runs and of 100 MB traces, this tree against another install, alternated.

Each command runs in a fresh process measured by _measure.py (wall seconds, user + system CPU
seconds, peak RSS of the process tree: the ingest's helper processes included), interpreter
start and imports included. The two installs take turns (A B B A ...) so that a machine whose
speed drifts weighs on both alike; medians over --repeat runs each.

    python benchmarks/bench_small_commands.py --before /path/to/other/.venv/bin/python \
        --big /tmp/b31/t100 /tmp/b31/cpu100

Results go to benchmarks/results/small_commands.{json,md}. --big adds trace folders (made by
make_big_trace.py) to the sample runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MEASURE = HERE / "_measure.py"
SAMPLES = ["pytorch/explicit", "pytorch/ddp", "pytorch/gpu_ddp_nccl", "tensorflow/explicit"]


def measure(argv: list[str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result = Path(fh.name)
    try:
        done = subprocess.run(
            [sys.executable, str(MEASURE), str(result), "--", *argv],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        got = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    if got["rc"] != 0:
        raise SystemExit(f"{argv} failed ({got['rc']}): {done.stderr[-2000:]}")
    return got


def _unplaced(arg: str) -> str:
    """An argument as the results name it: a path outside the repository by its last parts."""
    path = Path(arg)
    if not path.is_absolute():
        return arg
    if path.is_relative_to(REPO):
        return str(path.relative_to(REPO))
    return str(Path(*path.parts[-3:])) if len(path.parts) > 3 else path.name


def one(python: str, command: str, trace: Path, run: Path) -> dict[str, float]:
    if command == "ingest":
        shutil.rmtree(run, ignore_errors=True)
        argv = [python, "-m", "traceview", "ingest", str(trace), "-o", str(run)]
    else:
        argv = [python, "-m", "traceview", "report", "--json", str(run)]
    got = measure(argv)
    rss = max(got["maxrss_kb"], got["tree_rss_peak_kb"])
    return {
        "wall_s": got["proc_s"],
        "cpu_s": got["user_s"] + got["sys_s"],  # (its waited-for children included)
        "rss_mb": rss / 1024,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="python of the other install")
    p.add_argument("--before-label", default="another install", help="what it is (a commit)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--big", type=Path, nargs="*", default=[], help="large trace folders too")
    p.add_argument("--out", type=Path, default=HERE / "results" / "small_commands")
    args = p.parse_args()
    installs = {"this tree": sys.executable, "before": args.before}
    traces = [REPO / "sample_traces" / s for s in SAMPLES] + list(args.big)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        for trace in traces:
            # (a path of this machine means nothing in a clone: a folder elsewhere by its name)
            name = str(trace.relative_to(REPO)) if trace.is_relative_to(REPO) else trace.name
            runs: dict[tuple[str, str], list[dict[str, float]]] = {}
            for i in range(args.repeat):
                order = list(installs.items())
                if i % 2:
                    order.reverse()
                for label, python in order:
                    run = Path(tmp) / label.replace(" ", "-")
                    for command in ("ingest", "report"):
                        runs.setdefault((label, command), []).append(
                            one(python, command, trace, run)
                        )
            for (label, command), got in runs.items():
                rows.append(
                    {
                        "trace": name,
                        "install": label,
                        "command": command,
                        **{
                            k: round(statistics.median(g[k] for g in got), 3)
                            for k in ("wall_s", "cpu_s", "rss_mb")
                        },
                        "runs": got,
                    }
                )
                print(f"{name:40} {label:10} {command:7} {rows[-1]['wall_s']:7.2f} s", flush=True)
    command = [Path(sys.executable).name, *(_unplaced(a) for a in sys.argv)]
    info = {
        "command": " ".join(command),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "repeat": args.repeat,
        "before": args.before_label,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    lines = [
        f"Command: `{info['command']}`",
        "",
        f"Machine: {info['machine']}; median of {args.repeat} runs per install, alternated, "
        "each a fresh process (interpreter start and imports included); RSS: peak of the "
        "process tree. Before: " + args.before_label + ".",
        "",
        "| trace | command | this tree s | before s | this tree CPU s | before CPU s "
        "| this tree MB | before MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["trace"], r["command"], r["install"]): r for r in rows}
    for trace, command in dict.fromkeys((r["trace"], r["command"]) for r in rows):
        a, b = by[(trace, command, "this tree")], by[(trace, command, "before")]
        lines.append(
            f"| {trace} | {command} | {a['wall_s']:.2f} | {b['wall_s']:.2f} | {a['cpu_s']:.2f} "
            f"| {b['cpu_s']:.2f} | {a['rss_mb']:.0f} | {b['rss_mb']:.0f} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
