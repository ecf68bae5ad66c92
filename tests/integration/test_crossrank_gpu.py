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
from traceview.store.analysed import open_run

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
