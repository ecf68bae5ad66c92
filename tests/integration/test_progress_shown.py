"""Progress of a long ingest, as the real command draws it (forced where stderr is not a
terminal, as in a test): the files looked at, then the ranks ingested, counting up to the
total, each drawn in place and erased before the command's own output."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import run_cli
from tests.synthetic_jobs import Job, write

RANKS = 200


def test_ingesting_many_ranks_shows_how_far_it_has_come(tmp_path: Path) -> None:
    folder = write(Job(ranks=RANKS, steps=1), tmp_path / "traces")
    result = run_cli("ingest", folder, "-o", tmp_path / "run", env={"TRACEVIEW_PROGRESS": "1"})
    assert result.code == 0, result.err
    assert result.out.strip().endswith("s") and f"{RANKS} rank(s)" in result.out
    # (read as text, each \r that returns to the line's start reads as a newline)
    drawn = re.findall(r"\x1b\[Ktraceview: ([a-z ]+) ([\d,]+)/([\d,]+)", result.err)
    ingested = [int(d.replace(",", "")) for stage, d, total in drawn if stage == "ingesting ranks"]
    assert ingested, result.err
    assert all(total == f"{RANKS}" for stage, _, total in drawn if stage == "ingesting ranks")
    assert ingested == sorted(ingested) and ingested[-1] == RANKS
    assert result.err.endswith("\x1b[K")  # erased: nothing of it stays on the screen


def test_no_progress_where_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    folder = write(Job(ranks=RANKS, steps=1), tmp_path / "traces")
    result = run_cli("ingest", folder, "-o", tmp_path / "run")
    assert result.code == 0, result.err
    assert result.err == ""
