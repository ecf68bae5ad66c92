"""The hostile-input corpus's full tier (about 30 min): every case, run through the real CLI
(tests/hostile_run.py). Not collected by default: ``python -m pytest -m fuzz
tests/fuzz/test_hostile.py``."""

from __future__ import annotations

import pytest

from tests import hostile_corpus as H
from tests.hostile_run import CASES, Pool, _param, check


@pytest.mark.fuzz
@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_hostile_full(case: H.Case, hostile_pool: Pool) -> None:
    check(case, hostile_pool.result(case))
