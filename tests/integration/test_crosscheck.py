"""The integration tier's part of ``tests/unit/test_crosscheck.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import analysed, shared_traces
from traceview.analysis.summary import RunInputs, summarize
from traceview.model import schema as S
from traceview.runs import ingest_run
from traceview.store import rundir as R

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
    report = summarize(
        RunInputs(R.read_manifest(run), {"steps": analysed(run).steps, "ops": analysed(run).ops})
    )
    assert 100 * report.summary.comm_hidden_fraction == pytest.approx(hta_pct, abs=6.0)
