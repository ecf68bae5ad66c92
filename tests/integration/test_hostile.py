"""The hostile-input corpus's fast tier, in the normal test command: a fixed sample of cases, one
or a few of every family and format, and every known class's example, each run through the real
CLI (tests/hostile_run.py says what every run must hold to; the full tier is
tests/fuzz/test_hostile.py)."""

from __future__ import annotations

import pytest

from tests import hostile_corpus as H
from tests.hostile_run import BY_ID, Pool, _fast_ids, _param, check


@pytest.mark.parametrize("case", [_param(BY_ID[i]) for i in _fast_ids()])
def test_hostile_fast(case: H.Case, hostile_pool: Pool) -> None:
    check(case, hostile_pool.result(case))
