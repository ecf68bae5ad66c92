"""The safety net of refactoring: every golden case's output holds exactly (floats to 1e-9).

A change that alters an output on purpose regenerates its golden file in the same commit
(``python -m tests.golden.cases NAME``) and says why in the commit message. Goldens grow: a key
the golden file lacks whose value is null (or an empty list or object) is a field added since
it was written, holding nothing for that run, and no difference; a value that changed, a key
that went missing, or a new key that holds something is one.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import for_unit
from tests.golden.cases import SAMPLE_CASES, golden_diff, golden_path, run_case


def test_a_new_field_that_holds_nothing_is_no_difference_but_a_change_is() -> None:
    golden = {"summary": {"step_ms": 10.0, "ranks": [{"rank": 0}]}}
    grown = {"summary": {"step_ms": 10.0, "cause": None, "ranks": [{"rank": 0, "extra": []}]}}
    assert golden_diff(grown, golden) == []
    assert golden_diff({"summary": {"step_ms": 10.0, "cause": {"rank": 2}, "ranks": [{"rank": 0}]}},
                 golden) == ["$.summary.cause: unexpected"]  # fmt: skip
    assert golden_diff({"summary": {"step_ms": 11.0, "ranks": [{"rank": 0}]}}, golden) == [
        "$.summary.step_ms: 11.0, golden 10.0"
    ]
    assert golden_diff({"summary": {"ranks": [{"rank": 0}]}}, golden) == [
        "$.summary.step_ms: missing"
    ]
    # null where the golden holds a value is a change, not a new field
    assert golden_diff({"summary": {"step_ms": None, "ranks": [{"rank": 0}]}}, golden) != []


def _check(name: str, argv: list[str]) -> None:
    want = json.loads(golden_path(name).read_text())
    got = json.loads(json.dumps(run_case(argv)))
    differences = golden_diff(got, want)
    assert not differences, f"{name} differs from its golden output:\n" + "\n".join(
        differences[:20]
    )


@pytest.mark.parametrize("name", for_unit(sorted(SAMPLE_CASES), lambda name: SAMPLE_CASES[name]))
def test_sample_outputs_hold(name: str) -> None:
    _check(name, SAMPLE_CASES[name])
