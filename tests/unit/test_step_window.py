"""The TUI timeline reads one step of a rank from its events file's row groups (issue 15): the
lanes cut from that window equal the lanes cut from every event of the rank, on every sample
run, and the window reads only part of the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import SAMPLES, for_unit
from traceview.analysis.lanes import rank_lanes, window_read_span, windows_by_step
from traceview.runs import ingest_run, open_run
from traceview.store import rundir as R

SAMPLE_RUNS = sorted(
    str(p.relative_to(SAMPLES))
    for p in SAMPLES.glob("*/*")
    if p.is_dir() and p.name != "scaling" and any(p.iterdir())
)


def _small_row_groups(run: Path, rank: int, rows: int) -> int:
    """Rewrite the rank's events file in row groups of ``rows``, as a big trace's file is cut."""
    path = R.events_path(run, rank)
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=rows)
    return table.num_rows


def _a_steps_window_cuts_the_same_lanes_as_all_events(sample: str, tmp_path: Path) -> None:
    run_dir = ingest_run([SAMPLES / sample], tmp_path / "run")
    with open_run([run_dir]) as run:
        windows = windows_by_step(run.steps)
        threads = run.manifest.threads()
        ranks = sorted({rank for per_rank in windows.values() for rank in per_rank})
        assert windows and ranks, f"{sample}: no step windows"
        totals = {rank: _small_row_groups(run_dir, rank, 200) for rank in ranks}
        for step, per_rank in windows.items():
            if step is None:
                continue
            for rank, (start, end) in per_rank.items():
                whole = rank_lanes(run.events([rank]), rank, step, threads.get(rank, {}))
                span = window_read_span(windows, step, rank)
                assert span is not None and span[1] == end and span[0] <= start
                window = run.window_events(rank, *span)
                part = rank_lanes(window, rank, step, threads.get(rank, {}), window=(start, end))
                assert window.num_rows < totals[rank], f"{sample}: the window read everything"
                where = f"{sample} rank {rank} step {step}"
                assert (part.start_ns, part.end_ns, part.error) == (
                    whole.start_ns,
                    whole.end_ns,
                    whole.error,
                ), where
                assert [lane.label for lane in part.lanes] == [lane.label for lane in whole.lanes]
                for a, b in zip(part.lanes, whole.lanes, strict=True):
                    assert np.array_equal(a.starts, b.starts), f"{where}: {a.label}"
                    assert np.array_equal(a.ends, b.ends), f"{where}: {a.label}"
                    assert a.phases == b.phases, f"{where}: {a.label}"


@pytest.mark.parametrize("sample", for_unit(SAMPLE_RUNS, lambda s: (SAMPLES / s,)))
def test_a_steps_window_cuts_the_same_lanes_as_all_events(sample: str, tmp_path: Path) -> None:
    _a_steps_window_cuts_the_same_lanes_as_all_events(sample, tmp_path)


def test_a_window_skips_row_groups_that_start_after_it(tmp_path: Path) -> None:
    run_dir = ingest_run([SAMPLES / "pytorch" / "ddp"], tmp_path / "run")
    with open_run([run_dir]) as run:
        first_step = min(s for s in windows_by_step(run.steps) if s is not None)
        start, end = windows_by_step(run.steps)[first_step][0]
    _small_row_groups(run_dir, 0, 100)
    events = pq.read_table(R.events_path(run_dir, 0))
    ts, dur = events.column("ts_ns").to_numpy(), events.column("dur_ns").to_numpy()
    expected = int(((ts < end) & (ts + dur > start)).sum())
    window = R.read_window(run_dir, 0, start, end)
    assert window.num_rows == expected
    assert set(window.column("rank").to_pylist()) == {0}


def test_an_unnamed_thread_is_named_by_what_it_does() -> None:
    """Issue 48: a lane reads what a thread does, not a 64-bit id ("thread 4611686018427411422")."""
    import numpy as np

    from traceview.analysis.lanes import _unnamed

    start, end = np.array([0, 10, 40]), np.array([10, 40, 100])
    no = np.zeros(3, bool)
    gloo = 4611686018427411422
    assert _unnamed(gloo, ["comm", "comm", "idle"], no, start, end) == (
        "thread …411422 (communication)"
    )
    assert _unnamed(77, ["io", "backward", "backward"], no, start, end) == "thread 77 (backward)"
    assert _unnamed(77, ["other"] * 3, np.ones(3, bool), start, end) == "thread 77 (runtime calls)"
    assert _unnamed(77, ["other"] * 3, no, start, end) == "thread 77"
