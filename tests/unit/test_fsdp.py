"""FSDP's all-gathers unit by unit (collectives.unit, prefetched, needed_ns; fsdp.fsdp_gathers)
on small timelines laid out as FSDP2 records them, whose answers are worked out by hand."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from tests.unit.test_attribution import COMM_STREAM, GLOO, GPU_STREAM, ev, kernel, launch, step
from traceview.analysis.collectives import collective_calls
from traceview.analysis.fsdp import fsdp_gathers
from traceview.model import schema as S
from traceview.normalize.pipeline import RankMeta, normalize
from traceview.normalize.rules import builtin_rules

US = 1000  # ns


def region(name: str, ts: int, dur: int) -> dict[str, Any]:
    return ev(name, ts, dur, kind=S.KIND_ANNOTATION)


def calls(events: list[dict[str, Any]]) -> pl.DataFrame:
    table = S.conform(pa.Table.from_pylist(events), S.RAW_SCHEMA)
    normalized = normalize(table, builtin_rules("pytorch"), RankMeta("t", 0, "pytorch")).events
    out = pl.from_arrow(collective_calls(normalized))
    assert isinstance(out, pl.DataFrame)
    return out


#: one forward of two units on a CPU (gloo): layers.0 gathered in its own pre-forward and
#: waited for at once; layers.1 (a second parameter group: FSDP adds "[pg=2]") prefetched
#: while layers.0 computes, then waited for in its own pre-forward
CPU_FORWARD = [
    step(1, 0, 1000),
    region("FSDP::pre_forward (layers.0)", 10, 190),
    region("FSDP::all_gather (layers.0)", 12, 88),
    ev("c10d::_allgather_base_", 20, 10),
    ev("gloo:all_gather", 25, 65, tid=GLOO),  # done at 90
    region("FSDP::all_gather_copy_out (layers.0)", 110, 40),  # needed at 110
    region("FSDP::forward_prefetch for [layers.1]", 200, 120),
    region("FSDP::all_gather (layers.1) [pg=2]", 205, 105),
    ev("c10d::_allgather_base_", 210, 10),  # issued at 210
    ev("gloo:all_gather", 215, 85, tid=GLOO),  # done at 300
    ev("aten::linear", 330, 70),
    region("FSDP::pre_forward (layers.1) [pg=2]", 410, 70),
    region("FSDP::all_gather_copy_out (layers.1) [pg=2]", 420, 50),  # needed at 420
]


def test_cpu_gathers_know_their_unit_whether_prefetched_and_when_needed() -> None:
    df = calls(CPU_FORWARD)
    runs = df.filter(pl.col(S.NAME) == "gloo:all_gather").sort(S.START_NS)
    assert runs[S.UNIT].to_list() == ["layers.0", "layers.1"]
    assert runs[S.PREFETCHED].to_list() == [False, True]
    assert runs[S.NEEDED_NS].to_list() == [110 * US, 420 * US]
    assert runs[S.ISSUED_NS].to_list() == [20 * US, 210 * US]
    # the host calls that queued them say the same
    issues = df.filter(pl.col(S.NAME) == "c10d::_allgather_base_").sort(S.START_NS)
    assert issues[S.UNIT].to_list() == ["layers.0", "layers.1"]
    assert issues[S.NEEDED_NS].to_list() == [110 * US, 420 * US]


def test_fsdp_gathers_measure_from_the_workers_end_to_the_copy_out() -> None:
    comm = pl.DataFrame(
        {S.RANK: [0], S.STEP: [1], S.START_NS: [0], S.END_NS: [1], S.EXPOSED: [False]},
        schema={S.RANK: pl.Int32, S.STEP: pl.Int64, S.START_NS: pl.Int64, S.END_NS: pl.Int64,
                S.EXPOSED: pl.Boolean},
    )  # fmt: skip
    got = fsdp_gathers(calls(CPU_FORWARD).to_arrow(), comm.to_arrow(), 1)
    assert [(g.phase, g.unit, g.prefetched) for g in got] == [
        ("forward", "layers.0", 0.0),
        ("forward", "layers.1", 1.0),
    ]
    first, second = got
    # layers.0: issued 20, done 90, needed 110; layers.1: issued 210, done 300, needed 420
    assert (first.issued_ahead_ms, first.ahead_ms, first.total_ms) == (0.09, 0.02, 0.07)
    assert (second.issued_ahead_ms, second.ahead_ms, second.total_ms) == (0.21, 0.12, 0.09)
    assert first.calls_per_step == second.calls_per_step == 1.0


def test_a_gpu_gather_is_needed_when_its_copy_out_kernel_starts() -> None:
    """The all-gather kernel ends at 200 on its stream; the copy-out, launched at 160 on the
    host, runs its first kernel at 205 on the compute stream: 5 us ahead on the device, where the
    host call (which only launched the kernel) reads the host's copy-out start."""
    df = calls(
        [
            step(1, 0, 1000),
            region("FSDP::pre_backward (layers.0)", 0, 180),
            region("FSDP::all_gather (layers.0)", 0, 100),
            ev("c10d::_allgather_base_", 10, 10),
            launch(15, corr=1),
            kernel("ncclDevKernel_AllGather_RING_LL", 30, 170, corr=1, stream=COMM_STREAM),
            region("FSDP::all_gather_copy_out (layers.0)", 150, 20),
            launch(160, corr=2),
            kernel("split_with_sizes_copy", 205, 10, corr=2, stream=GPU_STREAM),
        ]
    )
    device = df.filter(pl.col(S.DEVICE) != S.DEVICE_CPU)
    assert device[S.UNIT].to_list() == ["layers.0"]
    assert device[S.NEEDED_NS].to_list() == [205 * US]
    assert device[S.PREFETCHED].to_list() == [False]
    host = df.filter(pl.col(S.DEVICE) == S.DEVICE_CPU)
    assert host[S.NEEDED_NS].to_list() == [150 * US]


def test_a_gather_without_its_copy_out_is_needed_at_no_known_time() -> None:
    """The root module's gather (FSDP names its regions without a unit) is never copied out in
    the trace; layers.0 is gathered twice before its one copy-out: that copy-out needs the second
    gather, and the first is needed at no time the trace shows."""
    df = calls(
        [
            step(1, 0, 1000),
            region("FSDP::all_gather", 0, 50),
            ev("c10d::_allgather_base_", 10, 30),
            region("FSDP::all_gather (layers.0)", 100, 50),
            ev("c10d::_allgather_base_", 110, 30),
            region("FSDP::all_gather (layers.0)", 200, 50),
            ev("c10d::_allgather_base_", 210, 30),
            region("FSDP::all_gather_copy_out (layers.0)", 300, 20),
            region("FSDP::post_backward_reduce (layers.0)", 400, 50),
            ev("c10d::_reduce_scatter_base_", 410, 30),
        ]
    ).sort(S.START_NS)
    assert df[S.UNIT].to_list() == ["(root)", "layers.0", "layers.0", "layers.0"]
    assert df[S.NEEDED_NS].to_list() == [None, None, 300 * US, None]
    assert df[S.PREFETCHED].to_list() == [False, False, False, None]  # (a reduce-scatter: null)
    assert df[S.COLLECTIVE].to_list()[-1] == "reduce_scatter"


def test_calls_outside_fsdp_have_no_unit() -> None:
    df = calls([step(1, 0, 100), ev("c10d::allreduce_", 10, 30)])
    assert df[S.UNIT].to_list() == [None]
    assert df[S.PREFETCHED].to_list() == [None]
    assert df[S.NEEDED_NS].to_list() == [None]
