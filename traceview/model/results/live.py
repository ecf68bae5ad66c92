"""The whole run as its step record tells it (analysis/whole_run.py), beside the profiled
window's analysis; and what ``traceview watch`` shows of a run while it trains (runs/live.py)."""

from __future__ import annotations

from typing import Literal

from traceview.model.results.base import Result
from traceview.model.results.failure import RankState


class SlowStep(Result):
    """A step well above the running median of the steps before it (``ms``: the job's step,
    its slowest rank's; ``rank``: the rank with the most own work in it; ``window``: the
    profile window it ends or lies in, whose trace is written at its end)."""

    step: int
    ms: float
    rank: int | None
    window: int | None = None


class StepChange(Result):
    """Where the step time moved to another level and stayed there (``step``: the first step
    at the new level; ``rank``: the rank whose own work changed most with it)."""

    step: int
    ms_before: float
    ms_after: float
    rank: int | None


class WholeRun(Result):
    """Every step of the run on every rank, profiled or not (the step record): ``steps`` the
    steps every rank's record holds; the job's step is its slowest rank's; the slowest rank is
    the one with the most own work per step (its step less its time blocked in collectives);
    null where no rank stands out by ``SLOWEST_MARGIN`` of the step."""

    steps: int
    step_ms_p50: float | None
    step_ms_p99: float | None
    slow_steps: list[SlowStep] = []
    slowest_rank: int | None = None
    # per rank: its own work per step (ms, mean), where the slowest rank is read from
    own_ms: list[float] = []
    changes: list[StepChange] = []  # the step time's level shifts, in step order
    first_step: int | None = None  # the job's numbers of the steps counted
    last_step: int | None = None


#: running: some rank still makes progress; finished: the job ended with code 0; failed: it
#: ended otherwise (or collect stopped without saying how it ended)
JobState = Literal["running", "finished", "failed"]
#: a rank: running, or how it stands where it stopped (analysis/failure.py's states)
LiveRankState = Literal["running"] | RankState


class LiveJob(Result):
    state: JobState
    started: str | None  # ISO 8601, when collect started the job
    steps: int  # the steps the slowest rank has finished
    host: str | None = None  # the host collect runs on
    exit_code: int | None = None


class LiveStepMs(Result):
    """The job's step (its slowest rank's), ms: the last every rank finished, and over the
    steps read (``over_steps``: the last of the run where it is long)."""

    last: float | None
    p50: float | None
    p99: float | None
    over_steps: int = 0


class LiveRank(Result):
    rank: int
    step: int  # steps finished
    step_ms: float | None  # its last step
    lag_steps: int  # behind the rank furthest on
    state: LiveRankState
    own_ms: float | None = None  # its own work per step, recent steps (step less comm)
    in_: str | None = None  # where it stands, where it stopped (the call or phase)
    since_s: float | None = None  # in it since, seconds


class Alert(Result):
    """``regression``: the recent steps above the running median; ``stopped``: a rank that
    finishes no step (with what it is in); ``last``: a rank persistently the slowest."""

    kind: Literal["regression", "stopped", "last"]
    text: str
    rank: int | None = None
    step: int | None = None


#: asked: no rank has written it yet; partial: some; complete: every rank; missed: the job ended
#: before its steps
WindowState = Literal["asked", "partial", "complete", "missed"]


class ProfileWindow(Result):
    """A window of profiled steps in the run directory (0: collect's own; then each
    ``traceview profile`` request). ``state``: asked (no rank has written it yet), partial,
    complete."""

    window: int
    first_step: int | None
    last_step: int | None
    state: WindowState
    ranks: int = 0
    began_step: int | None = None  # the step its profile began in (its warm-up's first)


class LiveSnapshot(Result):
    """``traceview watch RUN --once --json``: one look at a run collect is writing."""

    job: LiveJob
    step_ms: LiveStepMs
    slowest_rank: int | None
    ranks: list[LiveRank]
    slowest_since_step: int | None = None  # the step since which the slowest rank is slowest
    throughput_steps_s: float | None = None  # the job's steps per second, recent steps
    alerts: list[Alert] = []
    windows: list[ProfileWindow] = []
    recent_ms: list[float] = []  # the job's last steps (for a sparkline), oldest first
    taken_ns: int = 0
    warnings: list[str] = []
