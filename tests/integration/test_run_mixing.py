"""Issue 36 in the default suite: one or two cases of each class from tests/run_mixing.py
(which says what each checks); tests/fuzz/test_run_mixing.py runs them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.run_mixing import (
    CASES,
    Case,
    Runs,
    check_case,
    check_recompute_of_a_replaced_run,
    check_report_during_ingest,
    check_two_ingests,
    runs,  # noqa: F401 (the fixture)
)

CHOSEN = (
    "foreign-rank1", "cache-of-other-steps", "events-dir-link", "cache-link-steps", "unlisted-rank",
)  # fmt: skip


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if c.id in CHOSEN])
def test_a_run_directory_holding_another_runs_part(case: Case, runs: Runs, tmp_path: Path) -> None:  # noqa: F811
    check_case(case, runs, tmp_path)


def test_a_report_recomputing_while_an_ingest_replaces_the_run(runs: Runs, tmp_path: Path) -> None:  # noqa: F811
    check_report_during_ingest(runs, tmp_path, 1)


def test_two_ingests_into_one_output(runs: Runs, tmp_path: Path) -> None:  # noqa: F811
    check_two_ingests(runs, tmp_path, 1)


def test_a_recompute_of_a_replaced_run_writes_no_cache(runs: Runs, tmp_path: Path) -> None:  # noqa: F811
    check_recompute_of_a_replaced_run(runs, tmp_path)
