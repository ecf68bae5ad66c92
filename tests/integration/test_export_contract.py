"""What `export` writes, read as its readers read it (issue 34).

- Parquet: every table loads in polars, pandas and DuckDB alike; each table has one grain (the
  kernels of the three launches tables add up to the same count per rank, the report's, and
  the raw JSON's), and ``collectives.view`` separates a call's host view from its kernel.
- Chrome: read as the Trace Event Format specifies (flow events "s"/"f" bound to the slices
  enclosing them, metadata events naming processes and threads), every launch arrow starts in
  the runtime call and ends at the kernel it launched, as the raw JSON's ``correlation`` pairs
  them, and every track has a name.

Expected figures come from the shared traces' raw JSON (../shared/traces), not from traceview.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import SHARED, needs_module, run_cli

SAMPLED = SHARED / "pytorch" / "hta_sampled_2rank"
RESNET = SHARED / "pytorch" / "kineto_resnet50_num_workers_0"

_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
_RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}


def _raw(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def _export(folder: Path, tmp: Path, *args: str) -> Path:
    if not folder.exists():
        pytest.skip(f"shared traces not present at {folder}")
    run = tmp / "run"
    made = run_cli("ingest", folder, "-o", run)
    assert made.code == 0, made.err
    done = run_cli("export", run, *args)
    assert done.code == 0, done.err
    return run


@needs_module("duckdb", "reads the exported Parquet as DuckDB users do")
@needs_module("pandas", "reads the exported Parquet as pandas users do")
def test_parquet_tables_one_grain_in_polars_pandas_duckdb(tmp_path: Path) -> None:
    import duckdb
    import pandas as pd

    run = _export(SAMPLED, tmp_path, "-o", str(tmp_path / "out"))
    out = tmp_path / "out"
    files = sorted(out.glob("*.parquet"))
    names = {f.stem for f in files}
    assert {"launches", "launches_by_phase", "launches_by_rank", "collectives"} <= names
    kernels: dict[str, dict[int, int]] = {}
    for path in files:
        frame = pl.read_parquet(path)
        panda = pd.read_parquet(path)
        con = duckdb.connect()
        rows = con.execute(f"select count(*) from read_parquet('{path}')").fetchone()
        assert rows is not None and rows[0] == frame.height == len(panda), path.name
        if "kernels" in frame.columns:
            per_rank = {
                r: int(n)
                for r, n in con.execute(
                    f"select rank, sum(kernels) from read_parquet('{path}') group by rank"
                ).fetchall()
            }
            assert per_rank == {
                int(r): int(n) for r, n in panda.groupby("rank")["kernels"].sum().items()
            }
            assert per_rank == dict(frame.group_by("rank").agg(pl.col("kernels").sum()).rows())
            kernels[path.stem] = per_rank
    # one grain per table: each launches table counts every kernel once
    assert kernels["launches"] == kernels["launches_by_phase"] == kernels["launches_by_rank"]
    by_rank = pl.read_parquet(out / "launches_by_rank.parquet")
    assert by_rank.select("rank", "step").is_unique().all()
    by_phase = pl.read_parquet(out / "launches_by_phase.parquet")
    assert by_phase.select("rank", "step", "phase").is_unique().all()
    detail = pl.read_parquet(out / "launches.parquet")
    assert detail["phase"].null_count() == detail["op"].null_count() == 0
    assert detail.select("rank", "step", "phase", "op").is_unique().all()

    # against the report: kernels per counted step (the steps it does not exclude)
    report = run_cli("report", run, "--json")
    assert report.code == 0, report.err
    counted = [s["step"] for s in report.json()["per_step"] if not s["excluded"]]
    mine = by_rank.filter(pl.col("step").is_in(counted))
    assert counted and mine["step"].n_unique() == len(counted)
    for rank in report.json()["ranks"]:
        n = mine.filter(pl.col("rank") == rank["rank"])["kernels"].sum()
        assert rank["gpu"]["launches"] == pytest.approx(n / len(counted), abs=0.05)

    # against the raw JSON: the kernels each rank's runtime calls launched inside its steps
    for rank, trace in enumerate(sorted(SAMPLED.glob("*.json.gz"))):
        raw = [e for e in _raw(trace) if e.get("ph") == "X"]
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw if e["name"].startswith("ProfilerStep")]
        launches = {
            e["args"]["correlation"]: e
            for e in raw
            if e.get("cat") in _RUNTIME_CATS and "correlation" in e.get("args", {})
        }
        launched = [
            e
            for e in raw
            if e.get("cat") in {"kernel", "Kernel"}
            and e.get("args", {}).get("correlation") in launches
        ]
        in_steps = sum(1 for e in launched if any(s <= e["ts"] < t for s, t in steps))
        # a step's window runs on to its last kernel's end: kernels just past the host step count
        assert in_steps <= kernels["launches"][rank] <= len(launched), rank

        # collectives: one row per view of each call; the host view is each c10d:: call, the
        # device view each NCCL kernel
        coll = pl.read_parquet(out / "collectives.parquet").filter(pl.col("rank") == rank)
        assert set(coll["view"].unique()) <= {"host", "device"}
        assert (coll.filter(pl.col("view") == "device")["device"] == "gpu").all()
        host_calls = sum(
            1 for e in raw if e["name"].startswith("c10d::") and e.get("cat") == "cpu_op"
        )
        nccl = sum(
            1 for e in raw if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")
        )
        views = dict(coll.group_by("view").len().rows())
        assert views == {"host": host_calls, "device": nccl}


def _slices(trace: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    lanes: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in trace:
        if e.get("ph") == "X":
            lanes[(e["pid"], e["tid"])].append(e)
    return lanes


def _innermost(lane: list[dict[str, Any]], starts: list[float], ts: float) -> dict[str, Any] | None:
    """The slice of ``lane`` (sorted by start; ``starts`` its starts) that encloses ``ts`` and
    starts last."""
    for e in reversed(lane[: bisect.bisect_right(starts, ts)]):
        if ts <= e["ts"] + e["dur"]:
            return e
    return None


def test_chrome_export_flows_details_and_named_tracks(tmp_path: Path) -> None:
    """ResNet-50 (one rank, one stream): every launch arrow is whole and joins a runtime call to
    the kernel, copy or memset the raw trace says it launched; every track is named."""
    run = _export(RESNET, tmp_path, "--format", "chrome", "-o", str(tmp_path / "t.json"))
    del run
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    # the raw JSON's launch pairs: a device activity and the runtime call of its correlation
    (raw_path,) = RESNET.glob("*.json.gz")
    raw = [e for e in _raw(raw_path) if e.get("ph") == "X"]
    calls = {e["args"]["correlation"] for e in raw if e.get("cat") in _RUNTIME_CATS}
    pairs = sum(
        1
        for e in raw
        if e.get("cat") in _DEVICE_CATS and e.get("args", {}).get("correlation") in calls
    )
    config = {
        e["args"]["correlation"]: (e["args"]["grid"], e["args"]["block"])
        for e in raw
        if e.get("cat") in {"kernel", "Kernel"} and "grid" in e.get("args", {})
    }

    flows: dict[tuple[str, Any], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for e in trace:
        if e.get("ph") in ("s", "t", "f"):
            flows[(e["cat"], e["id"])][e["ph"]].append(e)
    assert len(flows) == pairs
    lanes = _slices(trace)
    starts, at = {}, {}
    for key, lane in lanes.items():
        lane.sort(key=lambda e: e["ts"])
        starts[key] = [e["ts"] for e in lane]
        at[key] = defaultdict(list)
        for e in lane:
            at[key][e["ts"]].append(e)
    checked = 0
    for key, parts in flows.items():
        assert len(parts["s"]) == 1 and len(parts["f"]) == 1, key
        (start,), (end,) = parts["s"], parts["f"]
        assert end.get("bp") == "e" and start["ts"] <= end["ts"], key
        lane = (start["pid"], start["tid"])
        launch = _innermost(lanes[lane], starts[lane], start["ts"])
        assert launch and launch["cat"] == "runtime", key
        kernel = at[(end["pid"], end["tid"])][end["ts"]]
        assert kernel and kernel[0]["cat"] in {"kernel", "memcpy", "memset"}, key
        details = kernel[0]["args"]
        assert {"correlation", "stream", "device"} <= details.keys(), key
        assert details["correlation"] == launch["args"]["correlation"], key
        if kernel[0]["cat"] == "kernel":  # its launch configuration, as the raw trace has it
            grid, block = config[details["correlation"]]
            assert (details["grid"], details["block"]) == (grid, block), key
        checked += 1
    assert checked == pairs

    named_threads = {
        (e["pid"], e["tid"]) for e in trace if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    named_processes = {
        e["pid"] for e in trace if e.get("ph") == "M" and e["name"] == "process_name"
    }
    used = {(e["pid"], e["tid"]) for e in trace if e.get("ph") in ("X", "i")}
    assert used <= named_threads
    assert {pid for pid, _ in used} <= named_processes
    names = [e["args"]["name"] for e in trace if e.get("ph") == "M" and e["name"] == "thread_name"]
    assert not [n for n in names if re.fullmatch(r"thread -?\d+", n)], names
    assert len(names) == len(set(names)), Counter(names).most_common(3)


def test_chrome_export_draws_the_last_arrival_the_phases_and_the_critical_path(
    tmp_path: Path,
) -> None:
    """A job whose rank 2 runs its forward 15 ms longer than the others, on clocks 3 ms apart:
    every arrow from a collective call ends on rank 2's call (it arrives last, every step),
    each rank's phase track covers each of its steps end to end, and the critical path's track
    holds rank 2's forward, 25 ms a step."""

    from tests.synthetic_jobs import Job, write
    from traceview.runs import ingest_run

    job = Job(ranks=3, steps=8, forward_ms={2: 25.0}, offset_ms={1: 3.0})
    run = tmp_path / "run"
    ingest_run([write(job, tmp_path / "traces")], run)
    out = tmp_path / "t.json"
    made = run_cli("export", str(run), "--format", "chrome", "-o", str(out))
    assert made.code == 0, made.err
    events = json.loads(out.read_text())["traceEvents"]
    starts = [e for e in events if e.get("cat") == "last arrival" and e["ph"] == "s"]
    ends = {e["id"]: e for e in events if e.get("cat") == "last arrival" and e["ph"] == "f"}
    assert starts and len(starts) == len(ends)
    assert {e["pid"] for e in starts} == {0, 1}
    assert {ends[e["id"]]["pid"] for e in starts} == {2}
    for s in starts:  # rank r waited wait(r) ms for rank 2, as the job was made
        assert s["args"]["wait_ms"] == pytest.approx(job.wait(s["pid"]), abs=0.05)
        # the arrow ends where rank 2's call begins, on the run's one clock: after the start
        assert ends[s["id"]]["ts"] >= s["ts"] - 1
    # each rank's phases add up to each of its steps
    steps = [e for e in events if e.get("cat") == "traceview" and e["name"].startswith("step ")]
    phases = [e for e in events if e.get("cat") == "traceview phase"]
    for step in steps:
        inside = [p["dur"] for p in phases
                  if p["pid"] == step["pid"] and p["args"]["step"] == int(step["name"][5:])]  # fmt: skip
        assert sum(inside) == pytest.approx(step["dur"], rel=1e-3), step
    path = [e for e in events if e.get("cat") == "critical path"]
    forward = sum(e["dur"] for e in path if e["name"] == "rank 2: forward") / 1000
    assert forward / len({e["args"]["step"] for e in path}) == pytest.approx(25.0, rel=0.02)
    assert not any(e["name"] in ("rank 0: forward", "rank 1: forward") for e in path)
