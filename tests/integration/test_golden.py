"""The safety net of refactoring: every golden case's output holds exactly (floats to 1e-9).

A change that alters an output on purpose regenerates its golden file in the same commit
(``python -m tests.golden.cases NAME``) and says why in the commit message.
"""

from __future__ import annotations

import pytest

from tests.conftest import beyond_unit
from tests.golden.cases import SAMPLE_CASES, shared_cases
from tests.unit.test_golden import _check

SHARED_CASES = shared_cases()


@pytest.mark.parametrize("name", beyond_unit(sorted(SAMPLE_CASES), lambda name: SAMPLE_CASES[name]))
def test_sample_outputs_hold(name: str) -> None:
    _check(name, SAMPLE_CASES[name])


@pytest.mark.parametrize(
    "name",
    beyond_unit(sorted(SHARED_CASES), lambda name: SHARED_CASES[name])
    or [
        pytest.param(
            None, marks=pytest.mark.skip(reason="../shared/traces is not beside the repository")
        )
    ],
)
def test_shared_trace_outputs_hold(name: str) -> None:
    _check(name, SHARED_CASES[name])
