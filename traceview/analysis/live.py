"""One look at a run while it trains (``traceview watch``): each rank's step and lag, the job's
step time, the slowest rank (the most own work per step: the one the others wait for) and
since when, throughput, and the alerts (a step-time regression, a rank that stopped finishing
steps, a rank persistently last). Pure: computed from what ``runs.live.LiveRun`` read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from traceview.analysis.step_series import (
    MIN_SEGMENT,
    SLOWEST_MARGIN,
    centred_median,
    profiled,
    step_changes,
)
from traceview.model.results.live import (
    Alert,
    JobState,
    LiveJob,
    LiveRank,
    LiveRankState,
    LiveSnapshot,
    LiveStepMs,
    ProfileWindow,
)

#: the steps the recent figures (throughput, the slowest rank's streak) look at
RECENT = 50
#: the steps of the running median of the slowest rank's margin over the others
STREAK = 9
#: a rank is the slowest where its own work per step exceeds the median rank's by this share
#: of the step (whole_run's rule)
MARGIN = SLOWEST_MARGIN
#: a rank the slowest for this many steps is persistently last (an alert)
LAST_FOR = 20
#: a regression: the step time rose by this share at a change and stayed there
REGRESSION = 0.10
#: the steps the regression alert looks back over (the newest)
HISTORY_STEPS = 5000
#: the last steps a sparkline shows
SPARK = 120
#: A rank's end in these words is a collective failing under it (analysis/failure.py's rule).
_COMM_FAILURE = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|broken pipe|peer|nccl|gloo|"
    r"processgroup|distbackenderror|watchdog",
    re.IGNORECASE,
)
_PHASE_WORDS = {
    "step": None,
    "io": "data loading",
    "comm": "a collective",
    "checkpoint": "a checkpoint",
}


@dataclass
class JobSaid:
    """What collect says of the job: when it started, where, how it ended (``exit_code``:
    None while it runs), whether its collect process lives (None: on another host), the
    stall threshold its ranks use."""

    started: str | None
    host: str | None
    exit_code: int | None
    ended: bool
    collect_alive: bool | None
    stall_s: float


@dataclass
class RankNow:
    """One rank as its record stands: steps finished, its last step, its recent own work (ms),
    where it is (its phase since when, its last call) and its end, where it ended."""

    rank: int
    steps_done: int
    last_step_ms: float | None
    own_ms: float | None
    last_end_ns: int | None
    phase: str | None
    phase_since_ns: int | None
    progress_ns: int | None
    call: dict[str, Any] | None
    pid: int | None
    end_state: str | None
    end_detail: str | None
    end_ns: int | None


@dataclass
class LiveInputs:
    job: JobSaid
    ranks: list[RankNow]
    steps: np.ndarray  # the job's steps every rank finished, in order
    step_ms: np.ndarray  # each one's slowest rank's duration
    step_rank: np.ndarray  # each one's rank with the most own work
    rows: dict[int, np.ndarray]  # each rank's newest step rows (parsers.record.STEP_DTYPE)
    now_ns: int
    warnings: list[str] = field(default_factory=list)
    windows: list[ProfileWindow] = field(default_factory=list)


def snapshot(inputs: LiveInputs) -> LiveSnapshot:
    """The look (``LiveSnapshot``) at the job ``inputs`` describe."""
    ms = inputs.step_ms
    median = float(np.median(ms)) if len(ms) else None
    stall_ns = max(inputs.job.stall_s, 5 * (median or 0) / 1e3) * 1e9
    ranks = [_rank(r, inputs, stall_ns) for r in inputs.ranks]
    furthest = max((r.step for r in ranks), default=0)
    for r in ranks:
        r.lag_steps = furthest - r.step
    slowest, since = _slowest(inputs)
    alerts = _alerts(inputs, ranks, slowest, since)
    running = not inputs.job.ended and inputs.job.collect_alive is not False
    state: JobState = (
        "running" if running else ("finished" if inputs.job.exit_code == 0 else "failed")
    )
    return LiveSnapshot(
        job=LiveJob(
            state=state,
            started=inputs.job.started,
            steps=min((r.step for r in ranks), default=0),
            host=inputs.job.host,
            exit_code=inputs.job.exit_code,
        ),
        step_ms=LiveStepMs(
            last=_ms(ms[-1]) if len(ms) else None,
            p50=_ms(median) if median is not None else None,
            p99=_ms(float(np.percentile(ms, 99))) if len(ms) else None,
            over_steps=len(ms),
        ),
        slowest_rank=slowest,
        slowest_since_step=since,
        ranks=ranks,
        throughput_steps_s=_throughput(inputs),
        alerts=alerts,
        windows=inputs.windows,
        recent_ms=[_ms(v) or 0.0 for v in ms[-SPARK:]],
        taken_ns=inputs.now_ns,
        warnings=inputs.warnings,
    )


def _rank(r: RankNow, inputs: LiveInputs, stall_ns: float) -> LiveRank:
    def rank(
        state: LiveRankState, in_: str | None = None, since_s: float | None = None
    ) -> LiveRank:
        return LiveRank(
            rank=r.rank,
            step=r.steps_done,
            step_ms=_ms(r.last_step_ms),
            lag_steps=0,
            own_ms=_ms(r.own_ms),
            state=state,
            in_=in_,
            since_s=since_s,
        )

    call = r.call
    # (inside its last call: it had not returned, or it raised out of it)
    open_call = call is not None and (
        (call["end_ns"] == 0 and not call["flags"] & 1) or bool(call["flags"] & 2)
    )
    call_words = (
        f"{call['op']} #{call['seq']}"
        if call is not None and call["seq"]
        else (call["op"] if call is not None else None)
    )
    state_said = r.end_state
    if state_said == "exception" and (r.end_detail or "").startswith("KeyboardInterrupt"):
        state_said = "signal"  # (the user's Ctrl-C: how it stood before it tells)
    if state_said == "ok":
        return rank("finished")
    if state_said == "exception" and _COMM_FAILURE.search(r.end_detail or ""):
        return rank("blocked", call_words)
    if state_said == "exception":
        return rank("crashed", _phase_words(r.phase))
    # (running, or ended by a signal: stopped where it made no progress for the threshold)
    now = r.end_ns or inputs.now_ns if state_said is not None else inputs.now_ns
    quiet_ns = now - (r.progress_ns or r.phase_since_ns or now)
    if quiet_ns > stall_ns:
        if open_call:
            since = (now - call["start_ns"]) / 1e9  # type: ignore[index]
            return rank("blocked", call_words, _s(since))
        return rank("stuck", _phase_words(r.phase), _s(quiet_ns / 1e9))
    if state_said is not None:
        return rank("killed", _phase_words(r.phase))
    if inputs.job.ended or inputs.job.collect_alive is False:  # (it left no end: killed)
        return rank("killed", _phase_words(r.phase))
    return rank("running")


def _slowest(inputs: LiveInputs) -> tuple[int | None, int | None]:
    """The rank with the most own work per step over the recent steps, where it stands out by
    ``MARGIN`` of the step; and the step from which its own work has stood out so (its margin
    over the median of the others, a running median of ``STREAK`` steps)."""
    own = {r.rank: r.own_ms for r in inputs.ranks if r.own_ms is not None}
    if len(own) < 2:
        return None, None
    values = np.array(list(own.values()))
    top = int(np.argmax(values))
    step_ms = float(np.median(inputs.step_ms[-RECENT:])) if len(inputs.step_ms) else 0.0
    if values[top] - float(np.median(values)) <= MARGIN * step_ms:
        return None, None
    rank = list(own)[top]
    numbers = inputs.steps[-HISTORY_STEPS:]  # (the recent steps: a look stays cheap)
    if not len(numbers) or rank not in inputs.rows:
        return rank, None
    aligned = np.full((len(inputs.rows), len(numbers)), np.nan)
    order = list(inputs.rows)
    for i, k in enumerate(order):
        rows = inputs.rows[k]
        at = np.searchsorted(numbers, rows["step"].astype(np.int64))
        inside = at < len(numbers)
        inside[inside] &= numbers[at[inside]] == rows["step"][inside]
        dur = (rows["end_ns"] - rows["start_ns"]).astype(float)
        aligned[i, at[inside]] = (dur - np.minimum(rows["comm_ns"], dur))[inside] / 1e6
    mine = aligned[order.index(rank)]
    others = np.delete(aligned, order.index(rank), axis=0)
    with np.errstate(all="ignore"):
        margin = mine - np.nanmedian(others, axis=0)
    known = np.isfinite(margin)
    if not known.any():
        return rank, None
    smooth = centred_median(margin[known], STREAK)
    behind = np.flatnonzero(smooth <= MARGIN * step_ms)
    start = int(behind[-1]) + 1 if len(behind) else 0
    if start >= len(smooth):
        return rank, None
    return rank, int(numbers[known][start])


def _alerts(
    inputs: LiveInputs, ranks: list[LiveRank], slowest: int | None, since: int | None
) -> list[Alert]:
    alerts = []
    # the ranks that stopped on their own first (stuck, crashed, killed), then those waiting
    # in a collective, one line per call they wait in
    for r in ranks:
        if r.state == "stuck" or (r.state in ("crashed", "killed") and not inputs.job.ended):
            where = f" in {r.in_}" if r.in_ else ""
            long = f" for {r.since_s:.0f} s" if r.since_s is not None else ""
            alerts.append(
                Alert(
                    kind="stopped",
                    rank=r.rank,
                    step=r.step,
                    text=f"rank {r.rank} stopped finishing steps at step {r.step}: "
                    f"{r.state}{where}{long}",
                )
            )
    waiting: dict[str, list[LiveRank]] = {}
    for r in ranks:
        if r.state == "blocked":
            waiting.setdefault(r.in_ or "a collective", []).append(r)
    for call, held in waiting.items():
        names = ", ".join(str(r.rank) for r in held[:8]) + (" ..." if len(held) > 8 else "")
        longest = max((r.since_s or 0.0) for r in held)
        alerts.append(
            Alert(
                kind="stopped",
                rank=held[0].rank,
                step=held[0].step,
                text=f"rank{'s' if len(held) > 1 else ''} {names} blocked in {call} at step "
                f"{held[0].step} for {longest:.0f} s",
            )
        )
    if len(inputs.step_ms) >= 2 * MIN_SEGMENT:
        spans = [
            (w.window, w.began_step, w.last_step)
            for w in inputs.windows
            if w.began_step is not None and w.last_step is not None
        ]
        outside = profiled(inputs.steps, spans) < 0
        changes = step_changes(
            inputs.steps[outside][-HISTORY_STEPS:],
            inputs.step_ms[outside][-HISTORY_STEPS:],
            _own_by_rank(inputs.rows, HISTORY_STEPS),
        )
        if changes:
            last = changes[-1]
            if last.ms_after > (1 + REGRESSION) * last.ms_before:
                who = f", rank {last.rank}'s own work the most" if last.rank is not None else ""
                alerts.append(
                    Alert(
                        kind="regression",
                        rank=last.rank,
                        step=last.step,
                        text=f"step time up from step {last.step}: {last.ms_before:.2f} → "
                        f"{last.ms_after:.2f} ms ({last.ms_after / last.ms_before:.2f}×){who}",
                    )
                )
    if slowest is not None and since is not None and len(inputs.steps):
        steps = int(inputs.steps[-1]) - since + 1
        if steps >= LAST_FOR:
            own = {r.rank: r.own_ms for r in ranks if r.own_ms is not None}
            middle = float(np.median([v for k, v in own.items() if k != slowest]))
            alerts.append(
                Alert(
                    kind="last",
                    rank=slowest,
                    step=since,
                    text=f"rank {slowest} the slowest for {steps} steps (since step {since}): "
                    f"its own work {own[slowest]:.2f} ms a step, the others' median {middle:.2f} ms",
                )
            )
    return alerts


def _own_by_rank(
    rows: dict[int, np.ndarray], newest: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each rank's own work per step (ms) from its ``newest`` record rows."""
    found = {}
    for rank, every in rows.items():
        held = every[-newest:]
        dur = (held["end_ns"] - held["start_ns"]).astype(float)
        found[rank] = (
            held["step"].astype(np.int64),
            (dur - np.minimum(held["comm_ns"], dur)) / 1e6,
        )
    return found


def _throughput(inputs: LiveInputs) -> float | None:
    """Steps per second over the recent steps, from the ranks' step ends."""
    rates = []
    for rows in inputs.rows.values():
        recent = rows[-RECENT:]
        if len(recent) >= 2:
            span = (int(recent["end_ns"][-1]) - int(recent["end_ns"][0])) / 1e9
            if span > 0:
                rates.append((len(recent) - 1) / span)
    return round(float(min(rates)), 3) if rates else None


def _phase_words(phase: str | None) -> str | None:
    return _PHASE_WORDS.get(phase or "step", phase) or "its step"


def _ms(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), 3)


def _s(seconds: float) -> float:
    return round(max(seconds, 0.0), 1)
