"""The critical path's batches (``source._batches``), cut a batch at a time, against their
definition taken a step at a time: a step opens a new batch where it would take the current one
past ``GRAPH_ROWS`` items and is not tied to the step before it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from traceview.analysis.critical_path import source as cp_source


def _step_at_a_time(sizes: list[int], tied: list[bool], room: int) -> list[list[int]]:
    steps = list(range(len(sizes)))
    if sum(sizes) <= room:
        return [steps]
    batches, held = [[0]], sizes[0]
    for i in range(1, len(steps)):
        if held + sizes[i] > room and not tied[i - 1]:
            batches.append([])
            held = 0
        batches[-1].append(i)
        held += sizes[i]
    return batches


class _Rows:
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def step_rows(self, steps: list[int]) -> np.ndarray:
        return np.array([self.sizes[s] for s in steps], np.int64)


@pytest.mark.parametrize("seed", range(4))
def test_batches_are_the_steps_greedy_cut(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Random steps (empty ones, ones larger than a batch) and ties, 500 draws a seed."""
    rng = random.Random(seed)
    for _ in range(500):
        n, room = rng.randint(1, 40), rng.randint(1, 60)
        sizes = [rng.choice([0, 1, 2, 5, 10, 30, 70]) for _ in range(n)]
        tied = [rng.random() < 0.3 for _ in range(n - 1)]

        def fake_tied(source: Any, steps: list[int], tied: list[bool] = tied) -> np.ndarray:
            return np.array(tied, bool)

        monkeypatch.setattr(cp_source, "GRAPH_ROWS", room)
        monkeypatch.setattr(cp_source, "_tied", fake_tied)
        got = cp_source._batches(_Rows(sizes), list(range(n)))  # type: ignore[arg-type]
        assert got == _step_at_a_time(sizes, tied, room), (sizes, tied, room)
