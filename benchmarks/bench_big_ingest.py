#!/usr/bin/env python3
"""Memory and time of `traceview ingest` on one multi-GB single-rank Kineto trace (issue 15).

For each size (default 1, 2 and 4 GB), a trace is made by make_big_trace.py (the steps of a
real GPU + NCCL trace replicated, CPU events first and device activities after, as PyTorch
writes them) unless it is there already. Then, each in a fresh process measured by
_measure.py (peak RSS, interpreter and imports included: the process's own, or the sum over it
and its helper process where that is larger; wall seconds):

  typed      the typed-decode reference: msgspec typed decode of the whole file into an Arrow
             table of the seven fields every analysis reads (name, ph, cat, pid, tid, ts, dur;
             _typed_decode.py; before 2026-11-27 it read four: name, ph, ts, dur)
  ingest     `traceview ingest FILE -o RUN` of this tree (chunked: the trace is large)
  normalize  the same ingest without the per-rank analysis (traceview.ingest.run.ingest with no
             analyze): parse, normalize and write the events, the part that runs in chunks
  before     the same command of another install (--before PYTHON, e.g. main's venv), if given

    nice python benchmarks/bench_big_ingest.py --data /tmp/big --sizes 1 2 4 \
        --before /work/main/.venv/bin/python

Results go to benchmarks/results/big_ingest.{json,md}; --keep keeps the traces (they are
deleted after each size otherwise). --single-step makes each trace one long step (a single
ProfilerStep over all the copies: make_big_trace.py --single-step); its results go to
benchmarks/results/big_ingest_one_step.{json,md}. --no-markers makes traces with no step
marker at all (a whole-run profile that never called prof.step(): one window); results in
benchmarks/results/big_ingest_no_markers.{json,md}. --kinds takes the trace kinds of
bench_decoders.py instead (each its real source trace from ../shared/traces and its flags: CPU
operators with shapes, GPU, no markers, one step, ROCm, the 2021 Kineto generation), every size
of each; results in benchmarks/results/big_ingest_kinds.{json,md}.

    python benchmarks/bench_big_ingest.py --kinds cpu_shapes gpu no_markers one_step rocm \
        kineto2021 --sizes 0.1 1 --data /tmp/kinds
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _measure import compiled  # type: ignore[import-not-found]
from bench_decoders import KINDS, SHARED  # type: ignore[import-not-found]  (one definition)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MEASURE = HERE / "_measure.py"
TYPED = HERE / "_typed_decode.py"


NORMALIZE_ONLY = (
    "import sys; from pathlib import Path; from traceview.ingest.run import ingest; "
    "ingest([Path(sys.argv[1])], Path(sys.argv[2]))"
)


def measure(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result = Path(fh.name)
    try:
        proc = subprocess.run(
            [sys.executable, str(MEASURE), str(result), "--", *argv],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=tempfile.gettempdir(),  # not a source tree: `-m traceview` is the install's
        )
        data = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    if data.get("rc") != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {
        "seconds": round(data["proc_s"], 2),
        # CPU of the process and its helper (user + system): where it exceeds the wall time,
        # both cores worked
        "cpu_s": round(data.get("user_s", 0.0) + data.get("sys_s", 0.0), 2),
        # the process's own peak, or its tree's (the helper that reads half of a plain trace:
        # RSS summed over the processes, sampled every 50 ms) where that is larger
        "peak_rss_mb": round(max(data["maxrss_kb"], data.get("tree_rss_peak_kb", 0)) / 1024, 1),
        "own_peak_rss_mb": round(data["maxrss_kb"] / 1024, 1),
        "foreign_cpu_s": round(data.get("foreign_cpu_s", 0.0), 1),
    }


def make_trace(
    size_gb: float, data: Path, source: Path | None, markers: str, kind: str | None = None
) -> Path:
    """``markers``: "steps" (every step marked), "one-step" or "no-markers"."""
    name = f"kineto-{size_gb:g}gb" + ("" if markers == "steps" else f"-{markers}")
    out = data / (name if kind is None else f"{kind}-{size_gb:g}gb")
    found = sorted(out.glob("rank0.pt.trace.json*"))
    if found:
        return found[0]
    subprocess.run(
        [
            sys.executable,
            str(HERE / "make_big_trace.py"),
            "--target-mb",
            str(size_gb * 1000),
            "-o",
            str(out),
            *(["--source", str(source)] if source else []),
            *(
                []
                if markers == "steps"
                else ["--single-step" if markers == "one-step" else "--no-markers"]
            ),
        ],
        check=True,
    )
    return sorted(out.glob("rank0.pt.trace.json*"))[0]


def traceview(python: str, trace: Path, run: Path) -> list[str]:
    return [python, "-m", "traceview", "ingest", str(trace), "-o", str(run)]


def _portable(arg: str) -> str:
    """An argument as the results may show it: a path of this machine (its home, work or temporary
    folders) means nothing in a clone, so only its last two parts are kept."""
    if re.match(r"/(?:work|root|tmp|home)/", arg):
        return ".../" + "/".join(Path(arg).parts[-2:])
    return arg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[1, 2, 4], help="GB (10^9 bytes)")
    p.add_argument("--data", type=Path, default=REPO / "bench-data")
    p.add_argument("--before", default=None, help="python of another install to compare with")
    p.add_argument("--keep", action="store_true", help="keep the traces made")
    p.add_argument("--source", type=Path, default=None, help="make_big_trace's --source")
    p.add_argument("--single-step", action="store_true", help="traces of one long step each")
    p.add_argument("--no-markers", action="store_true", help="traces with no step marker")
    p.add_argument("--out", type=Path, default=None, help="results (without the suffix)")
    p.add_argument(
        "--kinds", nargs="+", choices=list(KINDS), default=None,
        help="bench_decoders.py's trace kinds (sources and flags) instead of --source",
    )  # fmt: skip
    a = p.parse_args(argv)
    for python in (sys.executable, *([a.before] if a.before else [])):
        compiled(python)  # (as an install from a wheel has it)
    if a.single_step and a.no_markers:
        p.error("--single-step and --no-markers exclude each other")
    if a.kinds and (a.source or a.single_step or a.no_markers):
        p.error("--kinds brings each kind's source and markers: no --source or marker flag")
    markers = "one-step" if a.single_step else "no-markers" if a.no_markers else "steps"
    names = {"steps": "big_ingest", "one-step": "big_ingest_one_step"}
    a.out = a.out or HERE / "results" / (
        "big_ingest_kinds" if a.kinds else names.get(markers, "big_ingest_no_markers")
    )
    jobs: list[tuple[str | None, Path | None, str, float]] = []
    for kind in a.kinds or [None]:
        source, flags = (
            (a.source, []) if kind is None else (SHARED / KINDS[kind][0], KINDS[kind][1])
        )
        how = {"--single-step": "one-step", "--no-markers": "no-markers"}
        jobs += [(kind, source, how[flags[0]] if flags else markers, size) for size in a.sizes]
    rows: list[dict[str, Any]] = []
    for kind, source, markers, size in jobs:
        trace = make_trace(size, a.data, source, markers, kind)
        nbytes = trace.stat().st_size
        with tempfile.TemporaryDirectory(dir=a.data) as work:
            run = Path(work) / "run"
            row: dict[str, Any] = {"kind": kind, "size_gb": size, "file_bytes": nbytes}
            row["typed"] = measure([sys.executable, str(TYPED), str(trace)])
            row["ingest"] = measure(traceview(sys.executable, trace, run))
            events = json.loads((run / "manifest.json").read_text())["ranks"][0]["events"]
            row["events"] = events
            shutil.rmtree(run)
            row["normalize"] = measure([sys.executable, "-c", NORMALIZE_ONLY, str(trace), str(run)])
            shutil.rmtree(run)
            if a.before:
                row["before"] = measure(traceview(a.before, trace, run))
                shutil.rmtree(run)
        row["ingest_vs_typed"] = round(row["ingest"]["seconds"] / row["typed"]["seconds"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not a.keep:
            shutil.rmtree(trace.parent)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "command": " ".join(
            ["python", "benchmarks/bench_big_ingest.py", *map(_portable, argv or sys.argv[1:])]
        ),
    }
    a.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "| trace | events | typed decode (s / peak) | ingest (wall s (CPU) / peak) | ingest ÷ typed "
        + "| without the analysis (s / peak) |"
        + (" before (s / peak) |" if a.before else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if a.before else ""),
    ]
    for r in rows:
        cells = [
            f"{r['kind'] + ', ' if r.get('kind') else ''}{r['file_bytes'] / 1e9:.2f} GB",
            f"{r['events']:,}",
            f"{r['typed']['seconds']:.1f} s / {r['typed']['peak_rss_mb']:,.0f} MB",
            f"{r['ingest']['seconds']:.1f} s ({r['ingest'].get('cpu_s', 0):.1f} s CPU) / "
            f"{r['ingest']['peak_rss_mb']:,.0f} MB",
            f"{r['ingest_vs_typed']:.2f}×",
            f"{r['normalize']['seconds']:.1f} s / {r['normalize']['peak_rss_mb']:,.0f} MB",
        ]
        if a.before:
            cells.append(f"{r['before']['seconds']:.1f} s / {r['before']['peak_rss_mb']:,.0f} MB")
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + f"\n\n{meta['command']} ({meta['when']}, {meta['cpus']} CPUs)\n"
    a.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
