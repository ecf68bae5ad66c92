"""The integration tier's part of ``tests/unit/test_golden.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

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
