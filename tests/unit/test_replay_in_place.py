"""The replay's per-item steps that work without an array an item (one long step is millions
of items): each against its definition, item by item."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from traceview.analysis.critical_path.replay import _idle_tails, _minus_per_group
from traceview.model import schema as S


def _groups(rng: np.random.Generator, groups: int) -> np.ndarray:
    sizes = rng.integers(8, 40, groups)
    return np.repeat(np.arange(groups), sizes)


@pytest.mark.parametrize("groups", [1, 3, 255, 256, 257, 2_000])
def test_each_group_loses_its_own_amount(groups: int) -> None:
    rng = np.random.default_rng(groups)
    group = _groups(rng, groups)
    values = rng.random(len(group)) * 1e9
    heads = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    amounts = rng.random(groups) * 1e6
    expected = np.array([v - amounts[g] for v, g in zip(values, group, strict=True)])
    _minus_per_group(values, heads, amounts)
    assert np.array_equal(values, expected)


@pytest.mark.parametrize("groups", [1, 5, 300])
def test_idle_tails_are_the_idle_items_after_an_on_time_groups_last_wait(groups: int) -> None:
    rng = np.random.default_rng(groups + 1)
    group = _groups(rng, groups)
    n = len(group)
    kinds = rng.choice([S.SEGMENT_IDLE, S.SEGMENT_COMPUTE], n)
    wait = rng.random(n) < 0.15
    on_time = rng.random(groups) < 0.7
    # (group 0 on time, its one wait its first item: idle tails to find)
    wait[group == 0] = False
    wait[0] = on_time[0] = True
    items = pl.DataFrame({S.KIND: kinds})
    last = {}
    for i in range(n):
        if wait[i]:
            last[int(group[i])] = i
    expected = np.array(
        [
            kinds[i] == S.SEGMENT_IDLE
            and bool(on_time[group[i]])
            and int(group[i]) in last
            and i > last[int(group[i])]
            for i in range(n)
        ]
    )
    got = _idle_tails(items, group, wait, on_time)
    assert got.dtype == bool and np.array_equal(got, expected)
    assert expected.any() and not expected.all()  # (both kinds of item are met)


def test_durations_are_exact_over_block_edges() -> None:
    from traceview.analysis.critical_path.graph import _durations

    rng = np.random.default_rng(3)
    start = 1_700_000_000_000_000_000 + rng.integers(0, 10**12, 2_500)  # (ns since 1970)
    end = start + rng.integers(0, 10**9, 2_500)
    got = _durations(start, end, block=1_000)
    assert got.dtype == np.float64
    assert [int(x) for x in got] == [int(e) - int(s) for s, e in zip(start, end, strict=True)]
