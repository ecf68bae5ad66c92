"""Matching NCCL collectives across ranks, on multi-rank sets made from real GPU traces.

No full multi-rank NCCL run is at hand (the shared hta_sampled_2rank holds 2 of 128 ranks,
thinned upstream). So each set is made of copies of one real rank: every copy a rank of its own
on a host of its own, its clock shifted by a known offset, and on the straggler copy every NCCL
kernel starts later by a known share of its duration and ends when it did (it arrived late; the
others spun in their kernels until it came, then all finished together). Each generation of
trace is covered: the older marks collectives only with ``nccl:*`` annotations and kernel names
(hta_trace_diff_control, ``ncclKernel_*(ncclWorkElem)``); the newer carries ``Collective name``,
message sizes and the process group on the kernels themselves (hta_nccl_parser_config).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import shared_traces
from traceview.analysis.crossrank import cross_rank, match_collectives
from traceview.runs import open_run

DELAY_SHARE = 0.4  # of each of the straggler's NCCL kernels: how late it arrives
SETS = {
    "older": ("pytorch/hta_trace_diff_control/control.json.gz", 4),
    "newer": ("pytorch/hta_nccl_parser_config/nccl_data.json.gz", 2),
}
OFFSETS_US = [0.0, 2_500.0, -7_300.0, 41_000.0]


def _is_nccl_kernel(event: dict[str, Any]) -> bool:
    name = str(event.get("name", ""))
    return event.get("ph") == "X" and name.startswith(("ncclKernel", "ncclDevKernel"))


def make_set(source: Path, ranks: int, straggler: int, out: Path) -> Path:
    """``ranks`` copies of ``source`` in ``out`` (module docstring)."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        copy = json.loads(json.dumps(trace))
        info = copy.setdefault("distributedInfo", {})
        info.update(rank=rank, world_size=ranks)
        copy["host_name"] = f"gpu-node{rank}"
        offset = OFFSETS_US[rank]
        for event in copy["traceEvents"]:
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += offset
            if rank == straggler and _is_nccl_kernel(event):
                delay = DELAY_SHARE * event["dur"]
                event["ts"] += delay
                event["dur"] -= delay
        (out / f"rank-{rank}.json.gz").write_bytes(gzip.compress(json.dumps(copy).encode()))
    return out


@pytest.fixture(scope="module", params=list(SETS))
def gpu_set(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path, ranks = SETS[request.param]
    source = shared_traces(path)
    out = make_set(source, ranks, ranks - 1, tmp_path_factory.mktemp(request.param))
    with open_run([out]) as run:
        yield ranks, run


def test_nccl_kernels_match_with_the_same_op_and_bytes_on_every_rank(gpu_set) -> None:
    ranks, run = gpu_set
    matched = match_collectives(run.collectives)
    assert matched.calls.height > 0 and not matched.unmatched
    kernels = matched.calls.filter(pl.col("device") == "gpu")
    assert kernels.height == matched.calls.height, "the host-side calls are launches"
    per_call = kernels.group_by("name", "collective", "step_key", "position").agg(
        pl.col("rank").n_unique().alias("ranks"),
        pl.col("bytes").n_unique().alias("sizes"),
    )
    assert (per_call["ranks"] == ranks).all()
    assert (per_call["sizes"] == 1).all()


def test_the_straggler_and_its_delay_are_found_on_shifted_clocks(gpu_set) -> None:
    """The clocks are off by up to 41 ms; once estimated, every fast rank waits in every NCCL
    kernel what the straggler's kernel was delayed by, and the straggler waits for no one."""
    ranks, run = gpu_set
    crossed = cross_rank(run.collectives, run.tables["comm"], align_clocks=True)
    assert crossed.clocks is not None
    for rank, offset in crossed.clocks.offset_ns.items():
        assert offset / 1e3 == pytest.approx(OFFSETS_US[rank], abs=50), crossed.clocks
    calls = crossed.matched.calls.filter(pl.col("device") == "gpu")
    straggler = ranks - 1
    assert (calls["last_rank"] == straggler).all()
    slow = calls.filter(pl.col("rank") == straggler).select(
        "step_key", "position", "name", (pl.col("end_ns") - pl.col("start_ns")).alias("dur")
    )
    fast = calls.filter(pl.col("rank") != straggler).join(slow, on=["step_key", "position", "name"])
    # the straggler's kernel kept 1 - DELAY_SHARE of its duration: the delay is in proportion
    delay = fast["dur"] * DELAY_SHARE / (1 - DELAY_SHARE)
    error = (fast["wait_ns"] - delay).abs()
    assert error.max() < 60_000, error.describe()  # 60 µs: the clock estimate's residual
    assert calls.filter(pl.col("rank") == straggler)["wait_ns"].max() == 0
    report = run.report()
    assert report.run.clocks is not None and report.run.clocks.source == "collectives"
    assert report.summary.straggler_rank == straggler
    # NCCL's algorithm is read off the kernel names; bus bandwidth is over the transfer alone,
    # where the trace gives sizes
    for c in report.collectives:
        assert c.algorithm in ("RING_LL", "RING_SIMPLE") and c.algorithm in c.name, c.name
        if c.bytes:
            assert c.busbw_gbps is not None and c.busbw_gbps > 0


# --- several process groups (issue 32) -------------------------------------------------------------

#: A 2 x 2 mesh made of the newer set: ranks {0, 1} and {2, 3} are tensor-parallel pairs (groups
#: "1" and "2", mesh_tp); every step's first all-reduce and the broadcasts stay in the world ("0").
MESH_TP = {0: ("1", [0, 1]), 1: ("1", [0, 1]), 2: ("2", [2, 3]), 3: ("2", [2, 3])}
MESH_LATE = {1, 3}  # each pair's second rank arrives late at its pair's all-reduces


def make_mesh_set(source: Path, out: Path) -> Path:
    """Four copies of ``source`` (each on a host of its own, its clock shifted), declaring the
    world and their tensor-parallel pair in ``pg_config``; the all-reduces after each step's first
    name the pair (``Process Group Name``/``Ranks`` on the host call and the kernel), and on the
    pair's late rank those kernels start later by ``DELAY_SHARE`` of their duration."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    out.mkdir(parents=True, exist_ok=True)
    world = list(range(4))
    for rank in world:
        copy = json.loads(json.dumps(trace))
        name, pair = MESH_TP[rank]
        info = copy.setdefault("distributedInfo", {})
        info.update(rank=rank, world_size=4)
        info["pg_config"] = [
            {"pg_name": "0", "pg_desc": "default_pg", "ranks": world},
            {"pg_name": name, "pg_desc": "mesh_tp", "ranks": pair},
        ]
        copy["host_name"] = f"gpu-node{rank}"
        first_of_step: set[int] = set()
        steps = sorted(
            (e["ts"], e["ts"] + e["dur"])
            for e in copy["traceEvents"]
            if str(e.get("name", "")).startswith("ProfilerStep#")
        )
        seen_steps: set[int] = set()
        for event in sorted(copy["traceEvents"], key=lambda e: e.get("ts", 0)):
            args = event.get("args") or {}
            if args.get("Collective name") != "allreduce" or event.get("cat") != "cpu_op":
                continue
            step = next((i for i, (a, b) in enumerate(steps) if a <= event["ts"] < b), -1)
            if step not in seen_steps:
                seen_steps.add(step)
                first_of_step.add(args["External id"])
        for event in copy["traceEvents"]:
            args = event.get("args") or {}
            if args.get("Collective name") == "allreduce":
                in_pair = args.get("External id") not in first_of_step
                args["Process Group Name"] = name if in_pair else "0"
                args["Process Group Ranks"] = str(pair if in_pair else world)
                args["Group size"] = len(pair if in_pair else world)
                if in_pair and rank in MESH_LATE and _is_nccl_kernel(event):
                    delay = DELAY_SHARE * event["dur"]
                    event["ts"] += delay
                    event["dur"] -= delay
            elif "Process Group Name" in args:
                args["Process Group Ranks"] = str(world)
                args["Group size"] = 4
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += OFFSETS_US[rank]
        (out / f"rank-{rank}.json.gz").write_bytes(gzip.compress(json.dumps(copy).encode()))
    return out


def test_nccl_calls_are_matched_inside_their_groups(tmp_path: Path) -> None:
    """The groups read from pg_config and the calls' own Process Group Name: each all-reduce of
    a pair is matched with its pair only, the late rank of each pair is its last rank, and the
    other waits for it by the delay; the world's calls span all four ranks; the clocks of all
    four hosts are estimated through the world's all-reduces."""
    source = shared_traces(SETS["newer"][0])
    out = make_mesh_set(source, tmp_path / "mesh")
    with open_run([out]) as run:
        report = run.report()
        crossed = run.cross
    assert [(g.name, g.dim, g.ranks) for g in report.groups] == [
        ("0", None, [0, 1, 2, 3]),
        ("1", "tp", [0, 1]),
        ("2", "tp", [2, 3]),
    ]
    assert crossed is not None and not crossed.matched.unmatched
    assert report.run.clocks is not None and report.run.clocks.unaligned_ranks == []
    calls = crossed.matched.calls.filter(pl.col("device") == "gpu")
    per_key = calls.group_by("group", "name", "collective", "step_key", "position").agg(
        pl.col("rank").unique().sort().alias("ranks"), pl.col("last_rank").first()
    )
    pairs = per_key.filter(pl.col("group") != "0")
    assert pairs.height > 0
    for row in pairs.iter_rows(named=True):
        members = MESH_TP[row["ranks"][0]][1]
        assert row["ranks"] == members, row  # never across the pairs
        assert row["last_rank"] == members[1], row
    assert set(per_key.filter(pl.col("group") == "0")["ranks"].to_list()[0]) == {0, 1, 2, 3}
    # the early rank of a pair waits for the late one by the delay (within the clock estimate)
    early = calls.filter(pl.col("group") != "0", pl.col("rank").is_in([0, 2]))
    delay = DELAY_SHARE * (early["end_ns"] - early["start_ns"]).cast(pl.Float64)
    assert ((early["wait_ns"].cast(pl.Float64) - delay).abs() < 60_000).all(), early.select(
        "rank", "wait_ns", "start_ns", "end_ns"
    )
