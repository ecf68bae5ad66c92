"""One canonical name per kernel and operator, in every table (issue 34).

NCCL runs an all-to-all as SendRecv kernels (and names a grouped launch after its first
operation), so a kernel's name alone can say "send" for an all-to-all. The truth is the host
collective that launched the kernel, read here off the raw JSON: the kernel's ``correlation``
gives its runtime call, and the collective call (``c10d::`` or ``nccl:``) that encloses that
call on its thread, by time, is what it carried out. The events table (kernel's op and
collective), the collectives table (its device view) and the report's operators all say that.
TorchRec/fbgemm embedding operators get canonical names instead of ``CppNode<...>``.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import SHARED, run_cli

TRACES = ["hta_negative_queue_length", "hta_trace_diff_control", "hta_trace_diff_test"]
_HOST = re.compile(r"^(c10d::|nccl:)")
_KINDS = (
    ("alltoall", re.compile(r"(?i)all_?to_?all")),
    ("allreduce", re.compile(r"(?i)all_?reduce")),
    ("reduce_scatter", re.compile(r"(?i)reduce_?scatter")),
    ("allgather", re.compile(r"(?i)all_?gather")),
    ("broadcast", re.compile(r"(?i)broadcast")),
)


def _kind(name: str) -> str | None:
    return next((kind for kind, pattern in _KINDS if pattern.search(name)), None)


def launched_by(path: Path) -> Counter[str]:
    """Per NCCL kernel: the collective of the host call that launched it ("point-to-point"
    where none encloses its runtime call), counted."""
    with gzip.open(path, "rt") as f:
        events: list[dict[str, Any]] = [
            e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"
        ]
    runtime = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    hosts = [
        e
        for e in events
        if e.get("cat") in ("cpu_op", "user_annotation") and _HOST.match(e["name"])
    ]
    found: Counter[str] = Counter()
    for e in events:
        if e.get("cat") != "kernel" or not e["name"].startswith("ncclKernel"):
            continue
        call = runtime.get(e.get("args", {}).get("correlation"))
        if call is None:
            continue
        around = [
            h
            for h in hosts
            if h["tid"] == call["tid"] and h["ts"] <= call["ts"] <= h["ts"] + h["dur"]
        ]
        kinds = {_kind(h["name"]) for h in around} - {None}
        assert len(kinds) <= 1, kinds  # nested views of one call agree
        found[kinds.pop() if kinds else "point-to-point"] += 1
    return found


@pytest.mark.parametrize("name", TRACES)
def test_nccl_kernels_named_after_the_call_that_launched_them(name: str, tmp_path: Path) -> None:
    folder = SHARED / "pytorch" / name
    if not folder.exists():
        pytest.skip(f"shared trace {folder} not present")
    (trace,) = folder.glob("*.json.gz")
    truth = launched_by(trace)
    assert truth["alltoall"] > 0  # SendRecv kernels launched by all-to-alls: the case at hand
    run = tmp_path / "run"
    assert run_cli("ingest", folder, "-o", run).code == 0
    out = tmp_path / "out"
    done = run_cli("export", run, "-o", out)
    assert done.code == 0, done.err
    events = pl.read_parquet(out / "events.parquet").with_columns(
        pl.col(pl.Categorical).cast(pl.String)
    )
    nccl = events.filter(
        (pl.col("kind") == "kernel")
        & pl.col("name").str.starts_with("ncclKernel")
        & pl.col("parent").is_not_null()
    )
    seen = Counter(
        "point-to-point" if c in ("send", "recv") else c for c in nccl["collective"].to_list()
    )
    assert seen == truth
    assert (nccl["op"] == nccl["collective"]).all()  # the operator is the collective's name
    # the collectives table's device view says the same of each kernel
    device = pl.read_parquet(out / "collectives.parquet").filter(pl.col("view") == "device")
    kernels = events.filter((pl.col("kind") == "kernel") & (pl.col("device") == "gpu"))
    joined = device.join(
        kernels.select(
            pl.col("ts_ns").alias("start_ns"), "pid", "tid", pl.col("collective").alias("kernel")
        ),
        on=["start_ns", "pid", "tid"],
    )
    assert joined.height == device.height >= nccl.height
    assert (joined["collective"] == joined["kernel"]).all()


def test_embedding_operators_have_canonical_names(tmp_path: Path) -> None:
    """TorchRec's fbgemm embedding lookup and its backward are ``embedding`` and
    ``embedding_backward`` (with their kernels), never a raw ``CppNode<...>`` name."""
    folder = SHARED / "pytorch" / "hta_negative_queue_length"
    if not folder.exists():
        pytest.skip(f"shared trace {folder} not present")
    report = run_cli("report", folder, "--json")
    assert report.code == 0, report.err
    body = report.json()
    ops = [o["op"] for o in body["top_ops"]]
    kernels = [k["op"] for r in body["ranks"] if r["gpu"] for k in r["gpu"]["kernels"]]
    assert not [o for o in ops + kernels if o and "CppNode<" in o]
    run = tmp_path / "run"
    assert run_cli("ingest", folder, "-o", run).code == 0
    assert run_cli("export", run, "-o", tmp_path / "out").code == 0
    events = pl.read_parquet(tmp_path / "out" / "events.parquet").with_columns(
        pl.col(pl.Categorical).cast(pl.String)
    )
    lookup = events.filter(pl.col("name").str.contains("CppNode<SplitLookupFunction"))
    assert lookup.height and (lookup["op"] == "embedding_backward").all()
    forward = events.filter(
        pl.col("name").str.starts_with("fbgemm::split_embedding_codegen_lookup")
    )
    assert forward.height and (forward["op"] == "embedding").all()
