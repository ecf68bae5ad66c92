#!/usr/bin/env python3
"""Ingest of many ranks on local processes against a Dask distributed cluster, with the
client's and the workers' peak memory, and each rank's task time (issue 15).

    .venv/bin/python benchmarks/bench_cluster.py [--ranks 256 1024] [--real-mb 2.4] [--workers 2 [4 ...]]
        [--name cluster]

Trace sets (made once under bench-data/):
- synthetic: tests/synthetic_jobs.py jobs of known timing, 6 steps per rank (tiny traces: the
  cost is per rank, not per byte);
- real-sized (with --real-mb MB): make_big_trace.py replicates the DDP sample's steps into one
  trace of that size per rank, with per-rank clock offsets and jitter, gzipped.

Each set is ingested twice, each time by a fresh `traceview ingest` under _measure.py (wall
time, the client's peak RSS): on local processes, then on a fresh cluster of one `dask
scheduler` and --workers `dask worker --nthreads 1 --no-nanny` processes on 127.0.0.1, whose
peak RSS (VmHWM) is read before they are stopped; with several --workers counts, one fresh
cluster per count. From each run's manifest: the median and p90 of the per-rank task time
(parse, attribution, per-rank tables, write). On a 2-core machine a cluster measures Dask's
overhead, not a speed-up; the scale-out evidence there is that the per-rank time stays flat as
ranks grow and that the client's memory does not follow the ranks. On a machine with more cores,
the wall time against the number of workers is the speed-up. Results:
benchmarks/results/NAME.{md,json} (--name, default cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench-data"
RESULTS = REPO / "benchmarks" / "results"
MEASURE = REPO / "benchmarks" / "_measure.py"
BIN = Path(sys.executable).parent
DASK = [sys.executable, "-m", "dask"]  # the `dask` command, also where no script was installed


def synthetic(ranks: int) -> Path:
    out = DATA / f"cluster-synthetic-{ranks}"
    if not out.exists():
        sys.path.insert(0, str(REPO))
        from tests.synthetic_jobs import Job, write

        write(Job(ranks=ranks, steps=6), out.with_suffix(".tmp"))
        out.with_suffix(".tmp").rename(out)
    return out


def real_sized(ranks: int, mb: float) -> Path:
    out = DATA / f"cluster-real-{ranks}x{mb:g}mb".replace(".", "_")
    if not out.exists():
        source = next((REPO / "sample_traces" / "pytorch" / "ddp").glob("rank-0.*"))
        subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "make_big_trace.py"),
                "--source",
                str(source),
                "--target-mb",
                str(mb),
                "--ranks",
                str(ranks),
                "--gzip",
                "-o",
                str(out.with_suffix(".tmp")),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        out.with_suffix(".tmp").rename(out)
    return out


class Cluster:
    """A scheduler and workers on 127.0.0.1, as a user would start them."""

    def __init__(self, workers: int, tmp: Path) -> None:
        self.file = tmp / "scheduler.json"
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        log = (tmp / "dask.log").open("w")
        common = {"stdout": log, "stderr": subprocess.STDOUT, "env": env, "start_new_session": True}
        self.scheduler = subprocess.Popen(
            [
                *DASK,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(self.file),
            ],
            **common,  # type: ignore[call-overload]
        )
        self.workers = [
            subprocess.Popen(
                [
                    *DASK,
                    "worker",
                    "--scheduler-file",
                    str(self.file),
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                ],
                **common,  # type: ignore[call-overload]
            )
            for _ in range(workers)
        ]
        from distributed import Client

        deadline = time.monotonic() + 120
        while not self.file.exists():
            if time.monotonic() > deadline:
                raise SystemExit("the scheduler did not start")
            time.sleep(0.2)
        with Client(scheduler_file=str(self.file), timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)

    def worker_peaks_mb(self) -> list[float]:
        peaks = []
        for worker in self.workers:
            for line in Path(f"/proc/{worker.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        return peaks

    def stop(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*self.workers, self.scheduler]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def ingest(traces: Path, run: Path, extra: list[str]) -> dict:
    shutil.rmtree(run, ignore_errors=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        subprocess.run(
            [
                sys.executable,
                str(MEASURE),
                result.name,
                "--",
                str(BIN / "traceview"),
                "ingest",
                str(traces),
                "-o",
                str(run),
                *extra,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        measured = json.loads(Path(result.name).read_text())
    if measured["rc"] != 0:
        raise SystemExit(f"ingest of {traces} failed ({measured['rc']})")
    manifest = json.loads((run / "manifest.json").read_text())
    seconds = sorted(r["seconds"] for r in manifest["ranks"])
    return {
        "wall_s": round(measured["proc_s"], 2),
        "client_peak_mb": round(measured["maxrss_kb"] / 1024),
        "client_tree_peak_mb": round(measured["tree_rss_peak_kb"] / 1024),
        "rank_s_p50": round(statistics.median(seconds), 4),
        "rank_s_p90": round(seconds[int(0.9 * (len(seconds) - 1))], 4),
        "ranks": len(seconds),
        "traces_mb": round(
            sum(p.stat().st_size for p in traces.rglob("*") if p.is_file()) / 1e6, 2
        ),
        "foreign_cpu_s": round(measured["foreign_cpu_s"], 1),
    }


def save(rows: list[dict], name: str) -> None:
    """Write the results so far (a run cut short keeps its finished rows)."""
    print(rows[-1], flush=True)
    meta = {
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "| traces (on disk) | ingest on | wall s | per-rank task s (p50 / p90) "
        "| traceview peak MB (its processes) | worker peak MB | other processes' CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peaks = r.get("worker_peak_mb", [])
        workers = (
            ", ".join(str(p) for p in peaks) if len(peaks) <= 4 else f"max {max(peaks)}"
        ) or "-"
        lines.append(
            f"| {r['set']} ({r['traces_mb']} MB) | {r['where']} | {r['wall_s']} "
            f"| {r['rank_s_p50']} / {r['rank_s_p90']} | {r['client_tree_peak_mb']} | {workers} "
            f"| {r['foreign_cpu_s']} |"
        )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--real-mb", type=float, default=None, help="also real-sized ranks")
    parser.add_argument("--real-ranks", type=int, nargs="+", default=[256])
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--name", default="cluster", help="results file name")
    args = parser.parse_args()
    DATA.mkdir(exist_ok=True)
    sets = [(f"synthetic × {n}", synthetic(n)) for n in args.ranks]
    if args.real_mb:
        sets += [
            (f"real-sized × {n} (--real-mb {args.real_mb:g})", real_sized(n, args.real_mb))
            for n in args.real_ranks
        ]
    rows = []
    for label, traces in sets:
        run = DATA / "cluster-run"
        local = ingest(traces, run, [])
        rows.append({"set": label, "where": "local processes", **local})
        save(rows, args.name)
        for workers in args.workers:
            with tempfile.TemporaryDirectory() as tmp:
                cluster = Cluster(workers, Path(tmp))
                try:
                    remote = ingest(traces, run, ["--scheduler-file", str(cluster.file)])
                    remote["worker_peak_mb"] = [round(p) for p in cluster.worker_peaks_mb()]
                finally:
                    cluster.stop()
            rows.append({"set": label, "where": f"{workers}-worker Dask cluster", **remote})
            save(rows, args.name)
        shutil.rmtree(run, ignore_errors=True)
    print((RESULTS / f"{args.name}.md").read_text())


if __name__ == "__main__":
    main()
