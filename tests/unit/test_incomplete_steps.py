"""Steps that did not complete on every rank are left out of the figures, listed apart.

The collected case (a rank raising inside the profile) is in tests/live/test_collect.py; here a
trace cut short, as a rank killed mid-step leaves it (no collect, no status: the cut is all
there is to go on).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from tests.conftest import SAMPLES
from traceview.runs import open_run


def test_the_last_step_of_a_trace_cut_short_is_left_out(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLES / "pytorch" / "explicit", traces)
    cut = traces / "rank-1.pt.trace.json.gz"
    text = gzip.decompress(cut.read_bytes())
    cut.write_bytes(gzip.compress(text[: int(len(text) * 0.93)]))  # killed while writing
    with open_run([traces]) as run:
        report = run.report()
        rank1_steps = sorted(
            s for s, r in zip(run.steps["step"].to_pylist(), run.steps["rank"].to_pylist(),
                              strict=True) if r == 1
        )  # fmt: skip
    assert any("truncated" in w or "lost" in w for w in report.warnings), report.warnings
    [unfinished] = report.incomplete_steps
    assert unfinished.step == rank1_steps[-1] and 1 in unfinished.unfinished_ranks
    kept = [s.step for s in report.per_step]
    assert unfinished.step not in kept and kept == rank1_steps[:-1]
    assert report.run.steps == len(kept)
    assert all(r.steps == len(kept) for r in report.ranks)


def test_a_clean_run_has_no_incomplete_step() -> None:
    with open_run([SAMPLES / "pytorch" / "explicit"]) as run:
        report = run.report()
    assert report.incomplete_steps == [] and report.run.steps == 5
