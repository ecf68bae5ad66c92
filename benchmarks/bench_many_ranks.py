#!/usr/bin/env python3
"""Many small ranks at the speed of few large ones (issue 55): `traceview report --json FOLDER`
on a folder of 20,000 one-step ranks and on one of 1,024 real-sized ranks, this tree against
another install, side by side in one run.

    python benchmarks/bench_many_ranks.py --before /path/to/other/python [--before-label COMMIT]
        [--tiny-ranks 20000] [--real-ranks 1024] [--real-mb 4.5] [--repeat 1]

Trace sets (made once under bench-data/, gitignored):
- tiny: tests/synthetic_jobs.py's data-parallel job, one step per rank (~500 bytes gzipped a
  rank: the cost is per rank, not per byte);
- real-sized: make_big_trace.py replicates the DDP sample's steps into one trace of --real-mb
  MB per rank (gzipped, per-rank clock offsets and jitter), as bench_cluster.py's real-sized set.

Each command runs in a fresh process measured by _measure.py: wall seconds, CPU seconds (user +
system, the pool's workers included), the peak of the RSS summed over the process tree, and the
CPU other processes used meanwhile (the machine may be shared). The two installs take turns
(A B, then B A), and the report's JSON is checked for the number of ranks. Results:
benchmarks/results/many_ranks.{json,md} (--out).
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

from _measure import compiled  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = REPO / "bench-data"
MEASURE = HERE / "_measure.py"


def tiny(ranks: int) -> Path:
    out = DATA / f"many-ranks-{ranks}x1step"
    if not out.exists():
        sys.path.insert(0, str(REPO))
        from tests.synthetic_jobs import Job, write

        shutil.rmtree(out.with_suffix(".tmp"), ignore_errors=True)
        write(Job(ranks=ranks, steps=1), out.with_suffix(".tmp"))
        out.with_suffix(".tmp").rename(out)
    return out


def real_sized(ranks: int, mb: float) -> Path:
    out = DATA / f"many-ranks-real-{ranks}x{mb:g}mb".replace(".", "_")
    if not out.exists():
        source = next((REPO / "sample_traces" / "pytorch" / "ddp").glob("rank-0.*"))
        made = out.with_suffix(".tmp")
        shutil.rmtree(made, ignore_errors=True)
        done = subprocess.run(
            [
                sys.executable,
                str(HERE / "make_big_trace.py"),
                "--source",
                str(source),
                "--target-mb",
                str(mb),
                "--ranks",
                str(ranks),
                "--gzip",
                "-o",
                str(made),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise SystemExit(f"make_big_trace.py failed: {done.stderr[-2000:]}")
        made.rename(out)
    return out


def report(python: str, folder: Path, ranks: int) -> dict[str, float]:
    """`report --json FOLDER` (the traces ingested into a temporary run, then reported)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result = Path(fh.name)
    try:
        command = [python, "-m", "traceview", "report", "--json", str(folder)]
        done = subprocess.run(
            [sys.executable, str(MEASURE), str(result), "--", *command],
            capture_output=True,
            text=True,
            cwd=tempfile.gettempdir(),  # (not the repository: its traceview is not the install's)
        )
        got = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    if got["rc"] != 0:
        raise SystemExit(f"{python} report {folder} failed ({got['rc']}): {done.stderr[-2000:]}")
    reported = json.loads(done.stdout)["run"]["ranks"]
    if reported != ranks:
        raise SystemExit(f"{python} report {folder}: {reported} ranks, not {ranks}")
    cpu = got["user_s"] + got["sys_s"]
    return {
        "wall_s": round(got["proc_s"], 2),
        "cpu_s": round(cpu, 2),
        "wall_ms_per_rank": round(1000 * got["proc_s"] / ranks, 2),
        "cpu_ms_per_rank": round(1000 * cpu / ranks, 2),
        "tree_rss_mb": round(max(got["maxrss_kb"], got["tree_rss_peak_kb"]) / 1024),
        "processes": got["max_procs"],
        "others_cpu_s": round(got["foreign_cpu_s"], 1),
        "load_before": round(got["loadavg_before"][0], 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="python of the other install")
    p.add_argument("--before-label", default="another install", help="what it is (a commit)")
    p.add_argument("--after", default=sys.executable, help="python of this tree's install")
    p.add_argument("--after-label", default="this tree")
    p.add_argument("--tiny-ranks", type=int, default=20_000, help="0: no tiny set")
    p.add_argument("--real-ranks", type=int, default=1024, help="0: no real-sized set")
    p.add_argument("--real-mb", type=float, default=4.5)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", type=Path, default=HERE / "results" / "many_ranks")
    args = p.parse_args()
    for python in (args.before, args.after):
        compiled(python)  # (as an install from a wheel has it)
    installs = {"after": args.after, "before": args.before}
    sets = []
    if args.tiny_ranks:
        sets.append((f"{args.tiny_ranks} one-step ranks", tiny(args.tiny_ranks), args.tiny_ranks))
    if args.real_ranks:
        sets.append(
            (
                f"{args.real_ranks} real-sized ranks ({args.real_mb:g} MB each)",
                real_sized(args.real_ranks, args.real_mb),
                args.real_ranks,
            )
        )
    rows: list[dict[str, Any]] = []
    for name, folder, ranks in sets:
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        runs: dict[str, list[dict[str, float]]] = {label: [] for label in installs}
        for i in range(args.repeat):
            order = list(installs.items())
            if i % 2:
                order.reverse()
            for label, python in order:
                runs[label].append(report(python, folder, ranks))
                print(f"{name:45} {label:7} {runs[label][-1]}", flush=True)
        for label, got in runs.items():
            rows.append(
                {
                    "traces": name,
                    "bytes_on_disk": size,
                    "install": label,
                    **{
                        k: round(statistics.median(g[k] for g in got), 2)
                        for k in ("wall_s", "cpu_s", "wall_ms_per_rank", "cpu_ms_per_rank")
                    },
                    "tree_rss_mb": max(g["tree_rss_mb"] for g in got),
                    "runs": got,
                }
            )
    # The installs' interpreters are paths of the machine that ran it: named by their role.
    named = {str(args.before): "BEFORE_PYTHON", str(args.after): "AFTER_PYTHON"}
    argv = [Path(sys.executable).name, *(named.get(a, a) for a in sys.argv)]
    info = {
        "command": " ".join(argv),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "repeat": args.repeat,
        "after": args.after_label,
        "before": args.before_label,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    after, before = args.after_label, args.before_label
    lines = [
        f"Command: `{info['command']}`",
        "",
        f"Machine: {info['machine']}; `traceview report --json FOLDER`, median of {args.repeat} "
        "run(s) per install, alternated, each a fresh process; CPU: user + system of the "
        "process and its pool's workers; RSS: peak of the sum over the process tree; others' "
        f"CPU: what other processes used meanwhile. {after} against {before}.",
        "",
        "| traces | install | wall s | ms a rank (wall) | CPU s | CPU ms a rank | peak MB "
        "(tree) | others' CPU s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        label = after if row["install"] == "after" else before
        lines.append(
            f"| {row['traces']} | {label} | {row['wall_s']:.1f} | {row['wall_ms_per_rank']:.1f} "
            f"| {row['cpu_s']:.1f} | {row['cpu_ms_per_rank']:.1f} | {row['tree_rss_mb']} "
            f"| {sum(r['others_cpu_s'] for r in row['runs']) / len(row['runs']):.0f} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
