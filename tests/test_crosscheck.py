"""traceview against independent implementations on the same traces.

- torch-tb-profiler 0.4.3 (the TensorBoard plugin) on the CPU sample runs: its step times and
  its per-step communication/computation overlap.
- Holistic Trace Analysis on the real GPU/NCCL traces: its communication-computation overlap.

Differences that remain, and why:
- tb-profiler reports no DataLoader time on current PyTorch: since torch 2.x the DataLoader
  region is a user_annotation that its role classifier never reaches, so the data loading ends
  up in its "Other" bucket. traceview reports it as io (checked against timers elsewhere).
- tb-profiler's computation on CPU is every CPU operator, the communication calls on the training
  thread included (c10d::allreduce_, which blocks for milliseconds on a busy machine); traceview
  counts a thread blocked in a collective as exposed communication (docs/design.md). Its hidden
  fraction is therefore never above tb-profiler's, and on average within 0.1 below it.
- HTA measures overlap between NCCL kernels and compute kernels, leaving out the last profiled
  step; traceview's hidden fraction also counts the host-side communication calls (nccl:*
  regions, awaitable waits) and every step. On the same device kernels the two agree within a
  point; with the host side and all steps, within 6.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import SAMPLES, analysed, shared_traces
from traceview.analysis.summary import summarize
from traceview.model import schema as S
from traceview.store import rundir as R
from traceview.store.analysed import ingest_run


@pytest.fixture(scope="module")
def tb_profiler():
    return pytest.importorskip(
        "torch_tb_profiler.profiler.data", reason="pip install -e '.[bench]'"
    )


def _tb_parse(tb_profiler, path: Path):
    from torch_tb_profiler.profiler.event_parser import ProfileRole

    data = tb_profiler.RunProfileData.parse("worker", "span", str(path), tempfile.mkdtemp())
    return data, ProfileRole


@pytest.mark.parametrize("scenario", ["ddp", "explicit", "slowio"])
def test_tb_profiler_agrees_on_steps_and_overlap(
    tb_profiler, scenario: str, tmp_path: Path
) -> None:
    run = ingest_run([SAMPLES / "pytorch" / scenario], tmp_path / "run")
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    for rank in (0, 1):
        data, role = _tb_parse(
            tb_profiler, SAMPLES / "pytorch" / scenario / f"rank-{rank}.pt.trace.json.gz"
        )
        ours = steps.filter(pl.col(S.RANK) == rank).sort(S.STEP)
        assert [str(s) for s in ours[S.STEP]] == data.steps_names
        tb_total_ms = data.avg_costs.costs[role.Total] / 1000
        assert ours[S.WALL_NS].mean() / 1e6 == pytest.approx(tb_total_ms, abs=0.01)
        tb_hidden = [
            c.overlap / c.communication if c.communication else 0.0 for c in data.comm_overlap_costs
        ]
        our_hidden = ours[S.COMM_HIDDEN_FRACTION].to_list()
        # tb-profiler counts a training thread blocked inside c10d::allreduce_ as computation
        # overlapping the collective; traceview counts it as exposed communication. So
        # traceview's hidden fraction is never higher, and only a little lower on average.
        for i, (a, b) in enumerate(zip(our_hidden, tb_hidden, strict=True)):
            assert a <= b + 0.02, (
                f"rank {rank} step {data.steps_names[i]}: {a:.2f} vs tb-profiler {b:.2f}"
            )
        assert np.mean(tb_hidden) - np.mean(our_hidden) <= 0.1
        tb_comm_ms = data.avg_costs.costs[role.Communication] / 1000
        assert ours[S.COMM_TOTAL_NS].mean() / 1e6 == pytest.approx(tb_comm_ms, rel=0.1)
        # the known gap: no DataLoader time from tb-profiler, it lands in Other
        assert data.avg_costs.costs[role.DataLoader] == 0
        if scenario == "slowio":
            tb_other_ms = data.avg_costs.costs[role.Other] / 1000
            assert ours[S.phase_ns(S.IO)].mean() / 1e6 == pytest.approx(tb_other_ms, rel=0.12)


HTA_TRACES = [
    "hta_nccl_parser_config",
    "hta_trace_diff_test",
    "hta_trace_diff_control",
    "hta_df_index_resolver",
    "hta_negative_queue_length",
]


def _union(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    order = np.argsort(starts)
    merged: list[list[int]] = []
    for s, e in zip(starts[order].tolist(), ends[order].tolist(), strict=True):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _device_overlap(events: pl.DataFrame) -> float:
    """Share of NCCL kernel time (union) under compute kernels (union), from traceview's events."""
    kernels = events.filter(pl.col(S.KIND).cast(pl.String) == S.KIND_KERNEL)
    is_comm = pl.col(S.PHASE).cast(pl.String) == S.COMM
    comm = _union(*(kernels.filter(is_comm)[c].to_numpy() for c in (S.TS_NS, "end")))
    compute = _union(*(kernels.filter(~is_comm)[c].to_numpy() for c in (S.TS_NS, "end")))
    covered, i = 0, 0
    for s, e in comm:
        while i < len(compute) and compute[i][1] <= s:
            i += 1
        j = i
        while j < len(compute) and compute[j][0] < e:
            covered += min(e, compute[j][1]) - max(s, compute[j][0])
            j += 1
    total = sum(e - s for s, e in comm)
    return covered / total if total else 0.0


@pytest.mark.parametrize("name", HTA_TRACES)
def test_hta_agrees_on_communication_overlap(name: str, tmp_path: Path) -> None:
    trace_analysis = pytest.importorskip("hta.trace_analysis", reason="pip install -e '.[bench]'")
    folder = shared_traces(f"pytorch/{name}")
    os.environ.setdefault("HTA_DISABLE_LOGGING", "1")
    analysis = trace_analysis.TraceAnalysis(trace_dir=str(folder))
    hta_pct = float(
        analysis.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"].iloc[0]
    )

    run = ingest_run([folder], tmp_path / "run")
    events = pl.from_arrow(R.read_events(run))
    assert isinstance(events, pl.DataFrame)
    events = events.with_columns((pl.col(S.TS_NS) + pl.col(S.DUR_NS)).alias("end"))
    # HTA keeps only kernels launched by host operators of the iterations it considers complete
    # (not the last profiled step, for one): compare on the same kernels.
    rank = R.read_manifest(run).ranks[0].rank
    iterations = [int(i) for i in analysis.t.get_iterations(rank) if int(i) >= 0]
    same_kernels = events.filter(pl.col(S.STEP).is_in(iterations) & pl.col(S.PARENT).is_not_null())
    assert 100 * _device_overlap(same_kernels) == pytest.approx(hta_pct, abs=1.0)
    report = summarize(analysed(run).steps, analysed(run).ops, R.read_manifest(run))
    assert 100 * report.summary.comm_hidden_fraction == pytest.approx(hta_pct, abs=6.0)
