#!/usr/bin/env python3
"""Memory and time of `traceview ingest` on a large TF1 Timeline (streamed since 2026-11-28).

For each size (default 0.3 GB), a Timeline is made from a real one (../shared/traces, the
MNIST MLP on a GPU: 5 Session.runs) by repeating its events, each copy moved past the last,
unless it is there already: one Session.run is one step, so a 0.3 GB trace has about 7,000. Then,
each in a fresh process measured by _measure.py (peak RSS summed over the process and its
helper; wall seconds, interpreter and imports included):

  typed     the typed-decode reference (_typed_decode.py: name, ph, cat, pid, tid, ts, dur)
  ingest    `traceview ingest FILE -o RUN` of this tree (streamed, in chunks of steps)
  whole     the same with TRACEVIEW_WHOLE_RANK=1: the trace read whole, as before the stream

    python benchmarks/bench_timeline_ingest.py --sizes 0.3 1 --data /tmp/timelines

Results go to benchmarks/results/timeline_ingest.{json,md}; --keep keeps the traces made.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_big_ingest import TYPED, _portable, measure, traceview  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "traces"
SOURCE = SHARED / "tensorflow" / "tf1_timeline_mnist_mlp_gpu" / "timeline_03_merged_5_runs.json.gz"


def make_timeline(source: Path, out: Path, target_bytes: float) -> int:
    """``source``'s events repeated until ``out`` holds ``target_bytes``, each copy's times
    moved past the copy before (process names once, first, as TensorFlow writes them); the
    number of copies."""
    events = json.loads(gzip.decompress(source.read_bytes()))["traceEvents"]
    names = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") != "M"]
    times = [e["ts"] for e in timed if "ts" in e]
    span = max(times) - min(times) + 1000
    copies = 0
    with out.open("w") as fh:
        fh.write('{"traceEvents": [' + ", ".join(json.dumps(e) for e in names))
        while fh.tell() < target_bytes:
            shift = copies * span
            moved = ({**e, "ts": e["ts"] + shift} if "ts" in e else e for e in timed)
            fh.write(", " + ", ".join(json.dumps(e) for e in moved))
            copies += 1
        fh.write("]}")
    return copies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[0.3], help="GB (10^9 bytes)")
    p.add_argument("--data", type=Path, default=HERE.parent / "bench-data")
    p.add_argument("--keep", action="store_true", help="keep the traces made")
    p.add_argument("--out", type=Path, default=HERE / "results" / "timeline_ingest")
    a = p.parse_args(argv)
    if not SOURCE.exists():
        raise SystemExit(f"the source Timeline is not here: {SOURCE}")
    rows: list[dict[str, Any]] = []
    for size in a.sizes:
        folder = a.data / f"tf1-timeline-{size:g}gb"
        trace = folder / "timeline.json"
        if not trace.exists():
            folder.mkdir(parents=True, exist_ok=True)
            make_timeline(SOURCE, trace, size * 1e9)
        row: dict[str, Any] = {"size_gb": size, "file_bytes": trace.stat().st_size}
        with tempfile.TemporaryDirectory(dir=a.data) as work:
            run = Path(work) / "run"
            row["typed"] = measure([sys.executable, str(TYPED), str(trace)])
            row["ingest"] = measure(traceview(sys.executable, trace, run))
            rank = json.loads((run / "manifest.json").read_text())["ranks"][0]
            row["events"], row["steps"] = rank["events"], rank["steps"]
            shutil.rmtree(run)
            whole = {"TRACEVIEW_WHOLE_RANK": "1"}
            row["whole"] = measure(traceview(sys.executable, trace, run), whole)
        row["ingest_vs_typed"] = round(row["ingest"]["seconds"] / row["typed"]["seconds"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not a.keep:
            shutil.rmtree(folder)
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "command": " ".join(
            ["python", "benchmarks/bench_timeline_ingest.py", *map(_portable, argv or sys.argv[1:])]
        ),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "| Timeline | events | steps | typed decode (s / peak) | ingest, streamed (wall s (CPU)"
        " / peak) | ingest ÷ typed | read whole (s / peak) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        i, w, t = r["ingest"], r["whole"], r["typed"]
        lines.append(
            f"| {r['file_bytes'] / 1e9:.2f} GB | {r['events']:,} | {r['steps']:,} "
            f"| {t['seconds']:.1f} s / {t['peak_rss_mb']:,.0f} MB "
            f"| {i['seconds']:.1f} s ({i['cpu_s']:.1f} s CPU) / {i['peak_rss_mb']:,.0f} MB "
            f"| {r['ingest_vs_typed']:.2f}× | {w['seconds']:.1f} s / {w['peak_rss_mb']:,.0f} MB |"
        )
    text = "\n".join(lines) + f"\n\n{meta['command']} ({meta['when']}, {meta['cpus']} CPUs)\n"
    a.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
