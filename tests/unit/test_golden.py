"""The safety net of refactoring: every golden case's output holds exactly (floats to 1e-9).

A change that alters an output on purpose regenerates its golden file in the same commit
(``python -m tests.golden.cases NAME``) and says why in the commit message. Goldens grow: a key
the golden file lacks whose value is null (or an empty list or object) is a field added since
it was written, holding nothing for that run, and no difference; a value that changed, a key
that went missing, or a new key that holds something is one.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.conftest import for_unit
from tests.golden.cases import SAMPLE_CASES, golden_path, run_case


def _diff(got: Any, want: Any, where: str = "$") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in want if k not in got]
        out += [f"{where}.{k}: unexpected" for k in got if k not in want and not _empty(got[k])]
        for k in want.keys() & got.keys():
            out += _diff(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items, golden {len(want)}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in _diff(g, w, f"{where}[{i}]")
        ]
    if isinstance(want, float) or isinstance(got, float):
        numbers = isinstance(want, int | float) and isinstance(got, int | float)
        if numbers and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9):
            return []
    elif got == want and type(got) is type(want):
        return []
    return [f"{where}: {got!r}, golden {want!r}"]


def _empty(value: Any) -> bool:
    """A new field's value that says nothing about this run: null, [] or {}."""
    return value is None or value == [] or value == {}


def test_a_new_field_that_holds_nothing_is_no_difference_but_a_change_is() -> None:
    golden = {"summary": {"step_ms": 10.0, "ranks": [{"rank": 0}]}}
    grown = {"summary": {"step_ms": 10.0, "cause": None, "ranks": [{"rank": 0, "extra": []}]}}
    assert _diff(grown, golden) == []
    assert _diff({"summary": {"step_ms": 10.0, "cause": {"rank": 2}, "ranks": [{"rank": 0}]}},
                 golden) == ["$.summary.cause: unexpected"]  # fmt: skip
    assert _diff({"summary": {"step_ms": 11.0, "ranks": [{"rank": 0}]}}, golden) == [
        "$.summary.step_ms: 11.0, golden 10.0"
    ]
    assert _diff({"summary": {"ranks": [{"rank": 0}]}}, golden) == ["$.summary.step_ms: missing"]
    # null where the golden holds a value is a change, not a new field
    assert _diff({"summary": {"step_ms": None, "ranks": [{"rank": 0}]}}, golden) != []


def _check(name: str, argv: list[str]) -> None:
    want = json.loads(golden_path(name).read_text())
    got = json.loads(json.dumps(run_case(argv)))
    differences = _diff(got, want)
    assert not differences, f"{name} differs from its golden output:\n" + "\n".join(
        differences[:20]
    )


@pytest.mark.parametrize("name", for_unit(sorted(SAMPLE_CASES), lambda name: SAMPLE_CASES[name]))
def test_sample_outputs_hold(name: str) -> None:
    _check(name, SAMPLE_CASES[name])
