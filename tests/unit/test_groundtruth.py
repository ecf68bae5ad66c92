"""traceview's breakdown agrees with timers measured inside the training scripts.

The sample runs (sample_traces/pytorch, made by make_traces.py: CPU PyTorch, DDP over gloo, two
ranks under mpirun) recorded perf_counter timers around each phase of every step. The trace and
the timers see the same execution, profiler overhead included, so they must agree closely:

- per step, each phase within max(0.5 ms, 10 %) of its timer; the means within max(0.3 ms, 5 %).
  What remains is Python between the timer calls and the profiled region, and a thread that has
  been woken but not yet scheduled (2 ranks + gloo threads on 2 cores), which traceview reports
  as idle but the timer bills to the phase it interrupts.
- the backward timer covers loss.backward(), which under DDP includes the wait for the last
  buckets' all-reduce: it is compared with backward + exposed communication. Under the explicit
  scenario the all-reduce has a timer of its own.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SAMPLES, analysed
from tests.conftest import steps_with_timers as timed_steps
from traceview.analysis.summary import RunInputs, summarize
from traceview.model import schema as S
from traceview.model.results import RunReport
from traceview.runs import ingest_run
from traceview.store import rundir as R

SCENARIOS = ("ddp", "explicit", "slowio")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("runs")
    return {s: ingest_run([SAMPLES / "pytorch" / s], out / s) for s in SCENARIOS}


def _report(run: Path) -> RunReport:
    """The report of ``run`` from its steps and ops alone (no cross-rank pass)."""
    opened = analysed(run)
    return summarize(RunInputs(R.read_manifest(run), {"steps": opened.steps, "ops": opened.ops}))


def steps_with_timers(run: Path, truth_dir: Path) -> pl.DataFrame:
    return timed_steps(run, truth_dir).with_columns(
        (pl.col("backward_tv") + pl.col("comm_exposed_tv")).alias("backward_and_wait_tv"),
        (pl.col("backward_ms") + pl.col("allreduce_ms")).alias("backward_and_allreduce_ms"),
    )


PAIRS = {
    # traceview column -> timer
    "wall_tv": "step_ms",
    "io_tv": "data_ms",
    "forward_tv": "forward_ms",
    "update_tv": "optimizer_ms",
    "backward_and_wait_tv": "backward_and_allreduce_ms",
}


def check_against_timers(
    df: pl.DataFrame,
    label: str,
    per_step: float = 0.10,
    mean: float = 0.05,
    floor_ms: float = 0.5,
    idle_may_explain: bool = False,
    preempted: int = 0,
    slice_ms: float = 0.0,
) -> None:
    """Each step within max(floor_ms, per_step), the means within max(0.3 ms, mean).

    With ``idle_may_explain`` (runs made while the tests load the machine), a phase may also
    come out short of its timer by up to that step's idle time: a rank descheduled between
    two operators leaves a gap that traceview calls idle and the timer bills to its phase.
    ``preempted``: per rank and phase, that many steps may be off by up to twice the allowance
    (a rank descheduled between its timer and the profiler's mark, on a machine the tests
    load: one step, not all of them; an error in the attribution shows in every step and in
    the mean, which holds to ``mean`` regardless). ``slice_ms``: such a step may be off by a
    scheduler slice where that is more than twice the allowance (CFS lets a runnable task
    wait several ms on 2 busy cores)."""
    for ours, timer in PAIRS.items():
        error = (df[ours] - df[timer]).abs()
        allowed = (per_step * df[timer].abs()).clip(lower_bound=floor_ms)
        ok = error <= allowed
        if idle_may_explain:
            short = df[timer] - df[ours]
            ok = ok | ((short > 0) & (short <= df["idle_tv"] + allowed))
        bad = df.filter(~ok)
        if preempted:
            twice = (2 * per_step * bad[timer].abs()).clip(lower_bound=max(2 * floor_ms, slice_ms))
            near = bad.filter((bad[ours] - bad[timer]).abs() <= twice)
            spared = near.group_by(S.RANK).head(preempted)
            bad = bad.join(spared, on=[S.RANK, S.STEP], how="anti")
        assert bad.height == 0, (
            f"{label}: {ours} vs {timer} off by more than max({floor_ms} ms, {per_step:.0%})"
            f"{f' (or twice that in {preempted} step(s) a rank)' if preempted else ''}:\n"
            f"{bad.select(S.RANK, S.STEP, ours, timer, 'idle_tv')}"
        )
    means = df.group_by(S.RANK).agg(
        pl.col(list(PAIRS)).mean(), pl.col(list(PAIRS.values())).mean(), pl.col("idle_tv").mean()
    )
    for ours, timer in PAIRS.items():
        for row in means.iter_rows(named=True):
            allowed = max(0.3, mean * abs(row[timer]))
            short = row[timer] - row[ours]
            explained = idle_may_explain and 0 < short <= row["idle_tv"] + allowed
            assert abs(short) <= allowed or explained, (
                f"{label} rank {row[S.RANK]}: mean {ours} {row[ours]:.2f} ms vs {timer} {row[timer]:.2f} ms"
            )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_step_matches_the_timers(runs: dict[str, Path], scenario: str) -> None:
    check_against_timers(
        steps_with_timers(runs[scenario], SAMPLES / "pytorch" / scenario), scenario
    )


def test_explicit_allreduce_is_exposed_communication(runs: dict[str, Path]) -> None:
    df = steps_with_timers(runs["explicit"], SAMPLES / "pytorch" / "explicit")
    # Nothing overlaps a synchronous all-reduce issued after backward.
    assert (df["comm_hidden_fraction"] < 0.02).all()
    error = (df["comm_exposed_tv"] - df["allreduce_ms"]).abs()
    assert (error <= (0.1 * df["allreduce_ms"]).clip(lower_bound=0.5)).all(), df.select(
        "comm_exposed_tv", "allreduce_ms"
    )
    report = _report(runs["explicit"])
    assert report.summary.hidden == "no"
    assert report.summary.bottleneck == S.COMM


def test_ddp_hides_part_of_its_communication(runs: dict[str, Path]) -> None:
    df = steps_with_timers(runs["ddp"], SAMPLES / "pytorch" / "ddp")
    # DDP's timer has no all-reduce of its own: the exposed part is inside loss.backward().
    assert (df["allreduce_ms"] == 0).all()
    assert (df["comm_exposed_tv"] > 0).all() and (df["comm_total_tv"] > df["comm_exposed_tv"]).all()
    report = _report(runs["ddp"])
    assert report.summary.hidden == "partly"
    assert 0.3 < report.summary.comm_hidden_fraction < 0.95


def test_slow_data_loader_is_the_bottleneck(runs: dict[str, Path]) -> None:
    report = _report(runs["slowio"])
    summary = report.summary
    assert summary.bottleneck == S.IO
    truth = json.loads((SAMPLES / "pytorch" / "slowio" / "groundtruth.json").read_text())
    records = [r for r in truth["records"] if r["profiled"]]
    share = sum(r["data_ms"] for r in records) / sum(r["step_ms"] for r in records)
    assert abs(summary.bottleneck_share - share) < 0.03


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_exclusive_phases_sum_to_the_step(runs: dict[str, Path], scenario: str) -> None:
    steps = pl.from_arrow(analysed(runs[scenario]).steps)
    assert isinstance(steps, pl.DataFrame)
    total = steps.select(pl.sum_horizontal([S.phase_ns(p) for p in S.BREAKDOWN_PHASES])).to_series()
    assert (total == steps[S.WALL_NS]).all()


def test_one_preempted_step_is_spared_and_no_more() -> None:
    """``check_against_timers(preempted=1)``: one step per rank off by up to twice the
    allowance passes; a second such step, or one off by more, does not."""
    timers = {timer: [10.0] * 5 for timer in PAIRS.values()}
    ours = {column: [10.0] * 5 for column in PAIRS}

    def frame(forward: list[float]) -> pl.DataFrame:
        return pl.DataFrame(
            {S.RANK: [0] * 5, S.STEP: list(range(5)), **timers, **ours,
             "forward_tv": [float(x) for x in forward],
             "idle_tv": [0.0] * 5}
        )  # fmt: skip

    # allowance max(1 ms, 15 %) of 10 ms: 1.5 ms; twice that 3 ms; the means within 8 %
    check_against_timers(frame([10, 12.9, 10, 10, 9.9]), "one", 0.15, 0.08, 1.0, preempted=1)
    with pytest.raises(AssertionError):
        check_against_timers(frame([10, 12.9, 7.1, 10, 10]), "two", 0.15, 0.08, 1.0, preempted=1)
    with pytest.raises(AssertionError):
        check_against_timers(frame([10, 13.2, 10, 10, 10]), "far", 0.15, 0.08, 1.0, preempted=1)
    with pytest.raises(AssertionError):
        check_against_timers(frame([10, 12.9, 10, 10, 10]), "none", 0.15, 0.08, 1.0)
    # a scheduler slice of 4 ms spares 13.9 in one step, not 14.1, and still one step only
    # (the means held to 10 % here, so that only the per-step rule decides)
    sliced = partial(
        check_against_timers, per_step=0.15, mean=0.10, floor_ms=1.0, preempted=1, slice_ms=4.0
    )
    sliced(frame([10, 13.9, 10, 10, 10]), "slice")
    with pytest.raises(AssertionError, match="off by more"):
        sliced(frame([10, 14.1, 10, 10, 10]), "past")
    with pytest.raises(AssertionError, match="off by more"):
        sliced(frame([10, 13.9, 12.9, 10, 10]), "2x")
