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

import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import SAMPLES, analysed
from traceview.model import schema as S
from traceview.runs import ingest_run


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
