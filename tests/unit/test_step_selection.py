"""The steps the headline counts (analysis/selection.py): warm-up decided once over the run, on
every rank alike; --steps in the trace's own numbers and --skip; a choice outside the run is a
usage error. Step times are made up here so the rule's arithmetic is checked by hand."""

from __future__ import annotations

import polars as pl
import pytest

from traceview.analysis.selection import select_steps
from traceview.model import schema as S
from traceview.model.choice import StepChoice, step_choice
from traceview.model.errors import UsageError
from traceview.model.vocabulary import BREAKDOWN_PHASES, FORWARD, IDLE


def _steps(walls_ms: dict[int, list[float]]) -> pl.DataFrame:
    """rank -> wall times (ms) of steps 10, 11, ..."""
    rows = [
        {S.RANK: rank, S.STEP: 10 + i, S.WALL_NS: int(ms * 1e6)}
        for rank, walls in walls_ms.items()
        for i, ms in enumerate(walls)
    ]
    return pl.DataFrame(rows)


def test_leading_steps_over_1_3x_the_median_of_the_later_ones_are_warm_up() -> None:
    # 50 > 1.3 * median(30, 19, 18, 19) = 24.7; 30 > 1.3 * median(19, 18, 19) = 24.7; 19 is not
    # over 1.3 * median(18, 19) = 24.05
    selection = select_steps(_steps({0: [50, 30, 19, 18, 19]}))
    assert selection is not None
    assert selection.kept == [12, 13, 14]
    assert {n: why[0] for n, why in selection.excluded.items()} == {10: "warm-up", 11: "warm-up"}
    assert "50.0 ms against a median of 19.0 ms" in selection.excluded[10][1]


def test_steps_that_shorten_throughout_are_decided_at_once_and_named_in_brief() -> None:
    """Each step twice as long as the one after it (64, 32, ..., 1 ms, then 1 ms): every step
    is over 1.3x the median of the later ones until two remain. The medians past the first
    few come from one pass (a run of 100,000 such steps took minutes, a sort a step); the
    first five are named one by one, the rest counted in one remark."""
    halving = [float(2**k) for k in range(6, -1, -1)]
    walls = [w for w in halving for _ in range(3)] + [1.0, 1.0]  # 64 x3, 32 x3, ... 1 x3, 1, 1
    selection = select_steps(_steps({0: walls}))
    assert selection is not None
    # after the first 64 ms step the median of the 22 later ones is (4 + 8) / 2 = 6: warm-up,
    # and so down to the 2 ms steps (the median after the first is that of 2, 2, 1 x5: 1);
    # the first 1 ms step against a median of 1 is not
    expected = [10 + i for i in range(18)]
    assert sorted(selection.excluded) == expected
    assert selection.kept == [10 + i for i in range(18, len(walls))]
    assert len(selection.remarks) == 6
    assert selection.remarks[-1].startswith("and 13 more leading step(s) left out as warm-up")
    assert selection.remarks[-1].endswith("to step 27")


def test_a_later_outlier_is_kept() -> None:
    selection = select_steps(_steps({0: [19, 18, 60, 19]}))
    assert selection is not None and selection.kept == [10, 11, 12, 13]


def test_warm_up_is_decided_over_the_run_not_per_rank() -> None:
    """Rank 1's first step alone is slow; the mean over ranks (35, 20, 20) decides: the step is
    left out on both ranks, not on one."""
    selection = select_steps(_steps({0: [20, 20, 20], 1: [50, 20, 20]}))
    assert selection is not None and selection.kept == [11, 12]
    # (step 10 at a mean of 25 ms is under 1.3 x 20 = 26: it stays)
    selection = select_steps(_steps({0: [20, 20, 20], 1: [30, 20, 20]}))
    assert selection is not None and selection.kept == [10, 11, 12]


def test_two_steps_left_at_least() -> None:
    """With two steps there is no steady state to compare the first with: both count."""
    selection = select_steps(_steps({0: [50, 1]}))
    assert selection is not None and selection.kept == [10, 11]


def _with_work(walls_ms: list[float], idle_ms: list[float]) -> pl.DataFrame:
    """One rank's steps 10, 11, ... with their breakdown: ``idle_ms`` of each idle, the rest
    of its wall time forward."""
    steps = _steps({0: walls_ms})
    zero = [pl.lit(0, pl.Int64).alias(S.phase_ns(p)) for p in BREAKDOWN_PHASES]
    return steps.with_columns(zero).with_columns(
        pl.Series(S.phase_ns(IDLE), [int(ms * 1e6) for ms in idle_ms]),
        pl.Series(
            S.phase_ns(FORWARD),
            [int((w - i) * 1e6) for w, i in zip(walls_ms, idle_ms, strict=True)],
        ),
    )


def test_a_last_step_without_work_is_trailing_even_of_two() -> None:
    """A profile of two steps whose second is the profiler's empty window (a shared ROCm trace's
    shape: 9.3 ms, then 0.05 ms of nothing): that one step is left out, so the headline and the
    critical path speak of the step the job ran, not of a mean with an empty one."""
    selection = select_steps(_with_work([9.3, 0.05], [0.5, 0.05]))
    assert selection is not None and selection.kept == [10]
    assert selection.excluded[11][0] == "trailing"
    assert "no rank did any work" in selection.remarks[0]
    # the same last step with any work in it is a step of the job: both count
    selection = select_steps(_with_work([9.3, 0.05], [0.5, 0.04]))
    assert selection is not None and selection.kept == [10, 11]
    # an idle last step longer than the steps before it is not the profiler's window
    selection = select_steps(_with_work([9.3, 12.0], [0.5, 12.0]))
    assert selection is not None and selection.kept == [10, 11]


def test_steps_and_skip_choose_in_the_traces_numbers() -> None:
    steps = _steps({0: [50, 30, 19, 18, 19]})
    chosen = select_steps(steps, step_choice("11-13", None))
    assert chosen is not None and chosen.kept == [11, 12, 13]
    assert {why[0] for why in chosen.excluded.values()} == {"selection"}
    everything = select_steps(steps, step_choice(None, 0))
    assert everything is not None and everything.kept == [10, 11, 12, 13, 14]
    both = select_steps(steps, step_choice("11-14", 2))
    assert both is not None and both.kept == [13, 14]


@pytest.mark.parametrize(
    ("steps", "skip", "said"),
    [
        ("1-3", None, "no step in that range (its steps are 10-14)"),
        (None, 5, "--skip 5: that leaves no step"),
    ],
)
def test_a_choice_outside_the_run_is_a_usage_error(
    steps: str | None, skip: int | None, said: str
) -> None:
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        select_steps(_steps({0: [50, 30, 19, 18, 19]}), step_choice(steps, skip))


@pytest.mark.parametrize("text", ["x", "3-", "-3", "1-2-3", "5-4", ""])
def test_a_range_that_is_not_one_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        step_choice(text, None)


def test_unnumbered_steps_have_nothing_to_choose() -> None:
    one_window = pl.DataFrame(
        {S.RANK: [0], S.STEP: [None], S.WALL_NS: [10**9]},
        schema={S.RANK: pl.Int32, S.STEP: pl.Int64, S.WALL_NS: pl.Int64},
    )
    assert select_steps(one_window) is None
    with pytest.raises(UsageError, match="no numbered steps"):
        select_steps(one_window, StepChoice(1, 2))
