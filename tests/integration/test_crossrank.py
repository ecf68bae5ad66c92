"""The integration tier's part of ``tests/unit/test_crossrank.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, beyond_unit
from tests.synthetic_jobs import Job, write
from tests.unit.test_crossrank import MULTI_RANK, SHIFTED, _wait_and_transfer_add_up, report_of


@pytest.mark.parametrize("sample", beyond_unit(MULTI_RANK, lambda s: (SAMPLES / s,)))
def test_wait_and_transfer_add_up(sample: str) -> None:
    _wait_and_transfer_add_up(sample)


def test_estimated_offsets_put_the_export_on_one_clock(tmp_path: Path) -> None:
    """In the merged Chrome trace of the shifted job every rank's step starts where the others'
    do (they started together), though their clocks were up to 250 ms apart."""
    import gzip

    from tests.conftest import run_cli
    from traceview.runs import ingest_run

    job = Job(ranks=4, steps=6, forward_ms={3: 25.0}, **SHIFTED)  # type: ignore[arg-type]
    run = ingest_run([write(job, tmp_path / "job")], tmp_path / "run")
    result = run_cli("export", run, "--format", "chrome", "-o", tmp_path / "trace.json.gz")
    assert result.code == 0, result.err
    events = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))["traceEvents"]
    starts: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "traceview":
            starts.setdefault(e["name"], []).append(e["ts"])
    assert len(starts) == job.steps
    for name, ts in starts.items():
        assert len(ts) == job.ranks and max(ts) - min(ts) < 200, (name, ts)  # µs


def test_a_run_with_missing_ranks_says_why_nothing_is_split() -> None:
    """hta_sampled_2rank holds 2 of 128 ranks: any missing rank may be the last to arrive, so
    nothing is matched, the split is null (not 0) and a note says why."""
    from tests.conftest import shared_traces

    report = report_of(shared_traces("pytorch/hta_sampled_2rank"))
    assert report.run.missing_ranks and report.summary.comm_wait_ms is None
    assert all(r.comm_wait_ms is None for r in report.ranks) and not report.collectives
    assert any("not matched across ranks while ranks of the job are missing" in r
               for r in report.remarks)  # fmt: skip
