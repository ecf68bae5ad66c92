#!/usr/bin/env python3
"""Ingest benchmark for MXNet and Chainer traces (Chrome JSON whose begin and end records are
paired over the whole file): traceview against plain json.loads, side by side.

No other tool reads ``mx.profiler`` traces, or the Chainer traces traceview's collector writes,
into tables (MXNet's own answer is chrome://tracing or its aggregate-stats table), so the
comparison is the floor every Python reader pays: ``json.loads`` of the decompressed bytes.
The data set replicates the steps of a bundled run (``sample_traces/mxnet/local``,
``sample_traces/chainer/mlp``; timestamps shifted, ``step#N`` renumbered) to about
--target-mb of uncompressed JSON. ``--whole`` adds traceview with every rank read whole
(``TRACEVIEW_WHOLE_RANK=1``: how a Chainer trace was ingested before it was chunked).

Each measurement runs in a fresh process under _measure.py (wall time, peak RSS of the
command alone). Seconds are the command's wall time minus that of the same command on a tiny
trace (interpreter start and imports); data RSS is the peak minus that tiny run's peak.

    .venv/bin/python benchmarks/bench_ingest_mxnet.py --repeat 3
    .venv/bin/python benchmarks/bench_ingest_mxnet.py --format chainer --target-mb 1000 --whole
    .venv/bin/python benchmarks/bench_ingest_mxnet.py --format chainer --target-mb 296 \
        --before /path/to/other/python --before-label COMMIT

``--before``: the python of another install (a wrapper script that sets its PYTHONPATH); its
``traceview ingest`` is measured beside this tree's. Every command runs once a round, the
rounds repeated (a machine whose speed drifts moves every row alike), in a folder outside the
repository (so ``-m traceview`` is that install's).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
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
#: Per format: the run replicated, and the trace's file suffix.
SOURCES = {
    "mxnet": (REPO / "sample_traces" / "mxnet" / "local" / "rank-0.mxnet.json.gz", ".mxnet.json"),
    "chainer": (
        REPO / "sample_traces" / "chainer" / "mlp" / "rank-0.chainer.json.gz",
        ".chainer.json",
    ),
}
MB = 1 << 20
STEP = re.compile(r"^step#(\d+)$")


def replicate(source: Path, out: Path, copies: int) -> int:
    """Write ``copies`` back-to-back repetitions of the source's timed events; returns bytes."""
    document = json.loads(gzip.decompress(source.read_bytes()))
    events = document["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") != "M" and "ts" in e]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t0 + 1000
    steps = len({e["name"] for e in timed if STEP.match(str(e.get("name")))})
    replicated = list(meta)
    for copy in range(copies):
        for event in timed:
            shifted = dict(event, ts=event["ts"] + copy * span)
            match = STEP.match(str(event.get("name")))
            if match:
                shifted["name"] = f"step#{int(match.group(1)) + copy * steps}"
            replicated.append(shifted)
    document["traceEvents"] = replicated
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document))
    return out.stat().st_size


def measure(argv: list[str], work: Path) -> dict[str, Any]:
    result = work / "result.json"
    result.unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, str(MEASURE), str(result), "--", *argv],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=work,
    )
    data = json.loads(result.read_text())
    if data["rc"] != 0:
        raise SystemExit(f"failed ({data['rc']}): {' '.join(argv)}")
    return data


def loaders(
    traceview: list[str],
    work: Path,
    whole: bool = False,
    before: tuple[str, str] | None = None,
) -> dict[str, Any]:
    def json_loads(path: Path) -> list[str]:
        return [sys.executable, "-c", f"import json; json.loads(open({str(path)!r}, 'rb').read())"]

    def ingest_by(command: list[str], folder: str) -> Any:
        def ingest(path: Path) -> list[str]:
            out = work / folder
            shutil.rmtree(out, ignore_errors=True)
            return [*command, "ingest", str(path), "-o", str(out)]

        return ingest

    ingest = ingest_by(traceview, "run")

    def ingest_whole(path: Path) -> list[str]:
        return ["env", "TRACEVIEW_WHOLE_RANK=1", *ingest(path)]

    found = {"json.loads": json_loads, "traceview ingest": ingest}
    if before is not None:
        python, label = before
        found[f"traceview ingest ({label})"] = ingest_by([python, "-m", "traceview"], "run-before")
    if whole:
        found["traceview ingest, read whole"] = ingest_whole
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=sorted(SOURCES), default="mxnet")
    parser.add_argument("--target-mb", type=float, default=100.0)
    parser.add_argument("--whole", action="store_true", help="also traceview with ranks read whole")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="results/ingest_FORMAT by default")
    parser.add_argument("--before", help="python of another install, measured beside this tree")
    parser.add_argument("--before-label", default="another install", help="what it is (a commit)")
    args = parser.parse_args()
    source, suffix = SOURCES[args.format]
    data = REPO / "bench-data" / args.format
    args.out = args.out or HERE / "results" / f"ingest_{args.format}"

    traceview = [str(Path(sys.executable).with_name("traceview"))]
    tiny = data / "tiny" / f"rank-0{suffix}"
    if not tiny.exists():
        replicate(source, tiny, 1)
    copies = max(1, round(args.target_mb * MB / tiny.stat().st_size))
    big = data / f"{args.format}-{copies}x-1rank" / f"rank-0{suffix}"
    if not big.exists():
        replicate(source, big, copies)
    size = big.stat().st_size
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.format}-") as tmp:
        work = Path(tmp)
        before = (args.before, args.before_label) if args.before else None
        commands = loaders(traceview, work, args.whole, before)
        # (a round: every command on the tiny trace and on the big one)
        got: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
            name: ([], []) for name in commands
        }
        for _ in range(args.repeat):
            for name, command in commands.items():
                got[name][0].append(measure(command(tiny), work))
                got[name][1].append(measure(command(big), work))
        for name, (base, runs) in got.items():
            base_s = statistics.median(r["proc_s"] for r in base)
            base_kb = statistics.median(r["maxrss_kb"] for r in base)
            wall = statistics.median(r["proc_s"] for r in runs)
            peak_kb = statistics.median(r["maxrss_kb"] for r in runs)
            seconds = max(wall - base_s, 1e-9)
            rows.append(
                {
                    "loader": name,
                    "seconds": round(seconds, 3),
                    "mb_per_s": round(size / MB / seconds, 1),
                    "peak_rss_mb": round(peak_kb / 1024, 1),
                    "data_rss_mb": round((peak_kb - base_kb) / 1024, 1),
                    "data_rss_per_file": round((peak_kb - base_kb) * 1024 / size, 2),
                    "cpu_s": round(
                        statistics.median(r["user_s"] + r["sys_s"] for r in runs)
                        - statistics.median(r["user_s"] + r["sys_s"] for r in base),
                        3,
                    ),
                    "wall_s_runs": [round(r["proc_s"], 3) for r in runs],
                    "foreign_cpu_s": [round(r["foreign_cpu_s"], 2) for r in runs],
                }
            )
    table = [
        f"{args.format} trace: {size / MB:.1f} MB ({copies} copies of "
        f"{source.parent.relative_to(REPO)}), "
        f"median of {args.repeat}",
        "",
        "| loader | seconds | CPU s | MB/s | peak RSS | data RSS | data RSS ÷ file |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['loader']} | {r['seconds']:.2f} | {r['cpu_s']:.2f} | {r['mb_per_s']:.1f} | "
            f"{r['peak_rss_mb']:.0f} MB | {r['data_rss_mb']:.0f} MB | {r['data_rss_per_file']:.1f}× |"
            for r in rows
        ),
    ]
    command = " ".join([Path(sys.executable).name, *sys.argv]).replace(str(REPO) + "/", "")
    if args.before:
        command = command.replace(args.before, "BEFORE_PYTHON")
    table = [f"Command: `{command}`", "", *table]
    print("\n".join(table))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(table) + "\n")
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {"command": command, "file_mb": round(size / MB, 1), "copies": copies, "rows": rows},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
