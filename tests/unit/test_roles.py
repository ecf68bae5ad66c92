"""Parameter-server figures from step tables whose answer is known by construction: two workers
stepping at their own pace (an asynchronous job), one every 10 ms and one every 25 ms."""

from __future__ import annotations

import polars as pl
import pytest

from traceview.analysis.roles import busy_fractions, staleness
from traceview.model import schema as S

MS = 1_000_000


def workers(
    period_a: int = 10, period_b: int = 25, span: int = 1000, busy: float = 0.8
) -> pl.DataFrame:
    rows = []
    for rank, period in ((0, period_a), (1, period_b)):
        for k, start in enumerate(range(0, span, period)):
            rows.append(
                {S.RANK: rank, S.STEP: k, S.START_NS: start * MS,
                 S.END_NS: start * MS + int(period * busy * MS), S.WALL_NS: int(period * busy * MS)}
            )  # fmt: skip
    return pl.DataFrame(rows)


def test_staleness_counts_the_others_updates_between_pull_and_push() -> None:
    # worker 1 (every 25 ms) misses 2.5 of worker 0's updates a step; worker 0, 0.4 of worker 1's
    found = staleness(workers())
    assert found[1] == pytest.approx(2.5, abs=0.05)
    assert found[0] == pytest.approx(0.4, abs=0.05)


def test_staleness_over_the_time_every_worker_has_steps() -> None:
    # worker 1's steps stop at 500 ms: worker 0's later steps are not counted as seeing none
    frame = workers().filter((pl.col(S.RANK) == 0) | (pl.col(S.START_NS) < 500 * MS))
    assert staleness(frame)[0] == pytest.approx(0.4, abs=0.05)
    assert staleness(frame.filter(pl.col(S.RANK) == 0)) == {}


def test_busy_fraction_is_time_inside_steps_over_their_span() -> None:
    found = busy_fractions(workers(busy=0.8))
    # (the span ends with the last step, so its own idle tail is not in it)
    assert found[0] == pytest.approx(0.8, abs=0.01) and found[1] == pytest.approx(0.8, abs=0.01)
