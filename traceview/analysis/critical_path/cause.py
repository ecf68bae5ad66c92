"""The one cause (``Cause``): of what the critical path blames, the thing whose removal the replay
says saves the most. ``candidates`` reads each candidate off the blame with the change that
removes it; they are replayed with the report's other what-ifs; ``pick`` keeps the one that saves
the most, where that is more than the run's step-to-step noise could make of the mean step (else:
no cause, a balanced run).

The candidates, each a change ``whatif`` knows:

- late starts: the rank that starts last starting each step with the first
  (``no_late_start:rank=N``) where it holds them (``HOLDS``, ``PERSISTS``; the others late too
  are counted beside it), else every rank (``no_late_start``): the ranks late in turn;
- a rank's own work beyond the median rank's: that rank at the median of the others
  (``balance:rank=N``), for the few ranks with the most excess on the path (where none has any,
  the most own time on it), on the path in ``PERSISTS`` of the steps, named for the phase of its
  largest excess and that phase's top operator on the path;
- what is not the model's own work, on every rank: data loading and copies to the device
  (``without:io``, ``without:h2d``), host-bound time and kernel launches (``without:host_bound``,
  ``without:launch``), idle time inside a step (``without:idle``; ``without:idle:rank=N`` where
  one rank holds it), the transfer of communication
  the path cannot lay on a rank (``without:comm``), each named for the rank with the most of it
  on the path (none for transfer).

The model's own compute on balanced ranks is never a cause: it is what the step is for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from traceview.analysis.critical_path.graph import _COMPUTING, LATE_START, TRANSFER
from traceview.analysis.critical_path.late import BETWEEN_STEPS
from traceview.model import schema as S
from traceview.model.escape import safe
from traceview.model.results import Blame, Cause, Spent, WhatIf

#: How many ranks with the most excess on the path are each tried balanced.
RANKS_TRIED = 3

#: Phases that are not the model's own work: a cause even where every rank spends them alike.
OVERHEAD_PHASES = (S.IO, S.H2D)

#: A cause a rank holds alone (its own work beyond the others', a late start, idling) stands out
#: where it saves this share of the step (as much as the straggler's others wait for it,
#: summary.STRAGGLER_MIN_WAIT) and more than the steps' own spread; a cost of the whole run
#: (communication, data loading, launches on every rank: paid by design in part, as a last
#: gradient bucket's all-reduce) where it saves twice that.
RANK_FLOOR = 0.05
RUN_FLOOR = 0.10

#: A cause one rank holds is named over a cause of the whole run in the same phase where it
#: saves this share of what that one saves (one rank's slow data loading, not every rank's).
SPECIFIC = 0.8

#: One rank holds a cause where it has this share of it: of the late starts or idling on the
#: path; of what balancing every rank saves, balancing it alone. Below, the ranks take turns
#: (a loaded machine's scheduling, step-to-step jitter): a cost of the whole run, no straggler.
HOLDS = 0.5

#: The others wait for one rank alone where it causes this share of all their waiting: that wait,
#: measured, names it even where its replay saves less than the floors (``pick``).
WAITED_ALONE = 0.8

#: ... and where it is on the path in this share of the counted steps: a straggler is slow step
#: after step, while a loaded machine delays one rank now and another then.
PERSISTS = 0.75


@dataclass(frozen=True)
class Candidate:
    kind: str
    rank: int | None
    phase: str | None
    op: str | None
    blamed_ms: float  # its time on the critical path, ms per step
    change: str
    others: tuple[int, ...] = ()
    idle_ms: float = 0.0  # a late start's: its rank's idling on the path, in blamed_ms
    stage: int | None = None  # a pipeline stage's own work (``balance:stage=K``)

    @property
    def alone(self) -> bool:
        """Whether one rank holds it (its removal is that rank's: a straggler)."""
        return self.rank is not None and (
            self.change.startswith("balance:") or self.kind in (LATE_START, S.SEGMENT_IDLE)
        )


def _kind(kind: str, phase: str | None) -> str:
    return "io" if phase == S.IO and kind in _COMPUTING else kind


def _most(rows: pl.DataFrame, by: str, n_steps: int) -> tuple[object | None, float]:
    """Of ``rows`` (step, rank, phase, kind, op, ns), the ``by`` value with the most path time,
    and that time in ms per step (None where no row has one)."""
    rows = rows.filter(pl.col(by).is_not_null())
    if rows.height == 0:
        return None, 0.0
    totals = rows.group_by(by).agg(pl.col("ns").sum()).sort(["ns", by], descending=[True, False])
    return totals[by][0], float(totals["ns"][0]) / n_steps / 1e6


def candidates(
    rows: pl.DataFrame,
    n_steps: int,
    blame: list[Blame],
    ranks: int,
    clock_ms: float = 0.0,
    step_ms: float = 0.0,
    waited_for: dict[int, float] | None = None,
) -> list[Candidate]:
    """The causes worth replaying (module docstring), from the counted steps' path ``rows``
    (step, rank, phase, kind, op, ns: every piece of every path) and their ``blame``. A late
    start within twice ``clock_ms`` (how far the ranks' clocks may be off) is none. Where
    ``step_ms`` (the mean job step) is given, a candidate with less time on the path than its
    floor of it is not replayed: removing it could hardly save that much (each replay of a
    large run costs seconds)."""
    waited = waited_for or {}
    most = max(waited, key=lambda r: waited[r], default=None)
    # (a rank the others wait for, a RANK_FLOOR of the step: slow step after step, whether or
    # not its own work is on every step's path)
    held = most if most is not None and waited[most] >= RANK_FLOOR * step_ms > 0 else None
    found = _candidates(rows, n_steps, blame, ranks, clock_ms, held)
    return [c for c in found if c.blamed_ms >= (RANK_FLOOR if c.alone else RUN_FLOOR) * step_ms]


def _candidates(
    rows: pl.DataFrame,
    n_steps: int,
    blame: list[Blame],
    ranks: int,
    clock_ms: float,
    waited_for: int | None = None,
) -> list[Candidate]:
    out: list[Candidate] = []
    late = [b for b in blame if b.kind == LATE_START and b.ms > 2 * clock_ms]
    if late:  # (the change removes every late start: its evidence is all of theirs)
        last = max(late, key=lambda b: (b.ms, -b.rank))
        others = tuple(sorted(b.rank for b in late if b is not last))
        total = sum(b.ms for b in late)
        held = last.ms >= HOLDS * total and _persists(rows, n_steps, last.rank, LATE_START)
        # (the change also removes the idling that ends a late rank's steps after its last
        # wait, what makes it late: its idling on the path is evidence too, at most)
        idle = [b for b in blame if b.kind == S.SEGMENT_IDLE and (not held or b.rank == last.rank)]
        idle_ms = sum(b.ms for b in idle)
        if held:  # (its own late starts: what the change removes)
            out.append(
                Candidate(
                    LATE_START, last.rank, None, None, last.ms + idle_ms,
                    f"no_late_start:rank={last.rank}", others, idle_ms,
                )
            )  # fmt: skip
        else:  # (the ranks in turn: every late start)
            out.append(
                Candidate(
                    LATE_START, None, None, None, total + idle_ms, "no_late_start", others, idle_ms
                )
            )
    if ranks > 1:
        # per rank, its blame row of the largest excess; where none exceeds the median rank's
        # (the others' phases stretched by sharing cores while it computes alone), its row with
        # the most time on the path: the replay says whether balancing it saves anything
        worst: dict[int, Blame] = {}
        for b in blame:
            own = b.kind in _COMPUTING and b.phase not in (None, S.IDLE, S.COMM)
            if own and (b.rank not in worst or _weight(b) > _weight(worst[b.rank])):
                worst[b.rank] = b
        tried = sorted(worst.values(), key=lambda b: (*(-w for w in _weight(b)), b.rank))
        tried = [b for b in tried if b.rank == waited_for or _persists(rows, n_steps, b.rank, None)]
        for b in tried[:RANKS_TRIED]:
            mine = rows.filter(
                (pl.col("rank") == b.rank) & (pl.col("phase") == b.phase)
                & pl.col("kind").is_in(_COMPUTING)
            )  # fmt: skip
            op, op_ms = _most(mine, "op", n_steps)
            if op_ms < 0.5 * float(mine["ns"].sum()) / n_steps / 1e6:
                op = None  # (no operator holds most of it: time outside operators)
            out.append(
                Candidate(
                    _kind(b.kind, b.phase), b.rank, b.phase, None if op is None else str(op), b.ms,
                    f"balance:rank={b.rank}",
                )
            )  # fmt: skip
    for phase in OVERHEAD_PHASES:
        mine = rows.filter((pl.col("phase") == phase) & pl.col("kind").is_in(_COMPUTING))
        kind, _ = _most(mine, "kind", n_steps)
        if kind is not None:
            rank, _ = _most(mine, "rank", n_steps)
            total = float(mine["ns"].sum()) / n_steps / 1e6
            out.append(
                Candidate(
                    _kind(str(kind), phase), _int(rank), phase, None, total, f"without:{phase}"
                )
            )
    for kind in (S.SEGMENT_HOST_BOUND, S.SEGMENT_LAUNCH, S.SEGMENT_IDLE):
        mine = rows.filter(pl.col("kind") == kind)
        if mine.height == 0:
            continue
        rank, rank_ms = _most(mine, "rank", n_steps)
        top_phase, _ = _most(mine, "phase", n_steps)
        total = float(mine["ns"].sum()) / n_steps / 1e6
        others = tuple(sorted(set(mine["rank"].to_list()) - {rank}))
        change = f"without:{kind}"
        if kind == S.SEGMENT_IDLE and ranks > 1:
            if rank_ms >= HOLDS * total and _persists(rows, n_steps, rank, kind):
                change, total = f"without:{kind}:rank={rank}", rank_ms  # (its own idling)
            else:
                rank = None  # (ranks idle in turn: a cost of the whole run)
        # (the call or operator that holds most of the host's time: cudaFree is no launch)
        op, op_ms = _most(mine, "op", n_steps) if kind != S.SEGMENT_IDLE else (None, 0.0)
        named = str(op) if op is not None and op_ms >= 0.5 * total else None
        out.append(
            Candidate(
                kind, _int(rank), None if kind == S.SEGMENT_IDLE or top_phase is None else str(top_phase), named, total,
                change, others if kind == S.SEGMENT_IDLE else (),
            )
        )  # fmt: skip
    moving = rows.filter(pl.col("kind") == TRANSFER)
    if moving.height:
        op, _ = _most(moving, "op", n_steps)
        total = float(moving["ns"].sum()) / n_steps / 1e6
        out.append(
            Candidate(
                TRANSFER, None, S.COMM, None if op is None else str(op), total, "without:comm"
            )
        )
    return out


def _weight(b: Blame) -> tuple[float, float]:
    """How strongly a rank's own blame row marks it as slow: its excess over the median rank
    where positive, else its time on the path."""
    excess = b.excess_ms or 0.0
    return (excess, b.ms) if excess > 0 else (0.0, b.ms)


def _persists(rows: pl.DataFrame, n_steps: int, rank: object, kind: str | None) -> bool:
    """Whether ``rank`` has time of ``kind`` (None: its own work, in any phase) on the path in
    ``PERSISTS`` of the counted steps."""
    mine = rows.filter(pl.col("rank") == rank)
    mine = mine.filter(
        pl.col("kind") == kind if kind is not None else pl.col("kind").is_in(_COMPUTING)
    )
    return mine["step"].n_unique() >= PERSISTS * n_steps


def _int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def noise_ms(step_ms: list[float]) -> float:
    """How far the counted steps' mean could be off by their own spread: twice its standard
    error, with the spread taken as 1.4826 times the steps' median absolute deviation (the
    standard deviation where the steps vary normally, undisturbed by a few outliers). A cause
    whose replay saves less is within what another window of the same run could show; a saving
    the steps repeat stands out of a noisy run (four ranks on two cores: steps from 170 to
    440 ms, one rank 47 ms slower each)."""
    if len(step_ms) < 2:
        return 0.0
    steps = np.asarray(step_ms, np.float64)  # (numpy's median: the same float as statistics')
    middle = float(np.median(steps))
    spread = 1.4826 * float(np.median(np.abs(steps - middle)))
    return 2 * spread / math.sqrt(len(step_ms))


@dataclass(frozen=True)
class Picked:
    """``pick``'s verdicts: the cause (the candidate that saves the most), and the straggler (the
    one a rank holds alone that saves the most: the cause itself, or a lesser one beside a cause
    of the whole run); either None where nothing stands out."""

    cause: Cause | None
    straggler: Cause | None


#: The causes a rank's own timeline tells, whether or not its communication is explained (an
#: incomplete path: unmatched calls, ranks missing): the device waiting for the host or for
#: launches, time doing nothing, data loading and copies to the device.
OWN_TIMELINE = (S.SEGMENT_HOST_BOUND, S.SEGMENT_LAUNCH, S.SEGMENT_IDLE)


def across_ranks(c: Candidate) -> bool:
    """Whether the candidate is read across ranks (a late start, one rank against the others,
    exposed transfer): only where the path's communication is explained."""
    overhead = c.change.startswith("without:") and c.phase in OVERHEAD_PHASES
    return not (c.kind in OWN_TIMELINE or overhead)


def pick(
    found: list[Candidate],
    whatif: list[WhatIf],
    step_ms: list[float],
    ranks: int = 2,
    explained: bool = True,
    waited_for: dict[int, float] | None = None,
) -> Picked:
    """Of the candidates whose replay saves more than their floor (``RANK_FLOOR`` or
    ``RUN_FLOOR`` of the step, and ``noise_ms`` of the counted steps: ``step_ms``, their measured
    job steps), the one that saves the most (on a tie, the one with more time on the path).
    ``explained``: whether most counted steps' paths are complete; where not, only causes a
    rank's own timeline tells stand (``across_ranks``). ``waited_for``: by rank, the others'
    mean wait per step at the calls it arrived last to: the rank they wait for the most,
    ``RUN_FLOOR`` of the step and more, with its own work on the path ``RANK_FLOOR`` of it,
    holds that work's cause even where balancing every rank saves more than twice as much, and
    where its replay saves less than the floors (the steps' spread, ``RANK_FLOOR``): the replay
    keeps the others' idling, which may be its excess too (devices that share a host's cores),
    and the others' measured wait is the evidence."""
    replayed = {w.change: w for w in whatif}
    waited = waited_for or {}
    most_waited = max(waited, key=lambda r: waited[r], default=None)
    base = replayed.get("none")
    if base is None or base.step_ms <= 0:
        return Picked(None, None)
    noise = noise_ms(step_ms)
    balanced = replayed.get("balance")
    every_rank = base.step_ms - balanced.step_ms if balanced is not None else 0.0
    standing: list[tuple[float, float, Candidate, WhatIf]] = []
    for c in found:
        w = replayed.get(c.change)
        if w is None or (not explained and across_ranks(c)):
            continue
        saves = base.step_ms - w.step_ms
        waited_for_it = (
            c.rank is not None
            and c.rank == most_waited
            and waited[c.rank] >= RUN_FLOOR * base.step_ms
            and c.blamed_ms >= RANK_FLOOR * base.step_ms
        )
        if c.change.startswith("balance:") and saves < HOLDS * every_rank and not waited_for_it:
            continue  # (the ranks take turns being slow: no one rank holds it)
        floor = (RANK_FLOOR if c.alone else RUN_FLOOR) * base.step_ms
        if (
            waited_for_it
            and waited[c.rank] >= WAITED_ALONE * sum(waited.values())  # type: ignore[index]
            and c.change.startswith("balance:")
            and saves <= c.blamed_ms * 1.01
        ):
            # (the others' measured wait for it alone is the evidence; its replay, which keeps
            # their idling where it is its excess too (devices sharing a host's cores), need
            # only save something, no more than its own work on the path holds)
            floor = 0.0
        else:
            floor = max(noise, floor)
        if saves > floor:
            standing.append((saves, c.blamed_ms, c, w))
    best = max(standing, key=_rank_of, default=None)
    alone = max((x for x in standing if x[2].alone), key=_rank_of, default=None)
    if (
        best is not None
        and alone is not None
        and alone[2].phase == best[2].phase
        and alone[0] >= SPECIFIC * best[0]
    ):
        best = alone  # (one rank's data loading explains the run's: name the rank's)
    return Picked(
        _cause(*best, base.step_ms, ranks) if best is not None else None,
        _cause(*alone, base.step_ms, ranks) if alone is not None else None,
    )


def _rank_of(x: tuple[float, float, Candidate, WhatIf]) -> tuple[float, bool, float]:
    """Candidates ordered by what they save; of two that save the same (one replay: a rank's
    idling that its own excess work causes), its own work first; then by time on the path."""
    saves, blamed, c, _ = x
    return (saves, c.change.startswith("balance:"), blamed)


def _cause(
    saves: float, blamed: float, c: Candidate, w: WhatIf, base_ms: float, ranks: int
) -> Cause:
    cause = Cause(
        kind=c.kind,  # type: ignore[arg-type]
        rank=c.rank,
        phase=c.phase,  # type: ignore[arg-type]
        op=c.op,
        ms=round(saves, 3),
        blamed_ms=round(blamed, 3),
        change=c.change,
        step_ms=w.step_ms,
        speedup=round(base_ms / w.step_ms, 3) if w.step_ms > 0 else 0.0,
        text="",
        others=list(c.others),
        then_rank=w.last_rank if ranks > 1 and saves < TAKES_OVER * blamed else None,
        idle_ms=round(c.idle_ms, 3) if c.idle_ms > 0 else None,  # (a late start's)
        stage=c.stage,
    )
    cause.text = cause_words(cause, base_ms, ranks)
    return cause


#: Removing a cause that saves less than this share of its blamed time: another chain of the
#: step takes over, and the words say which rank then ends the step.
TAKES_OVER = 0.5


#: How the words name a phase that is not the model's own work.
_PHASE_WORDS = {S.IO: "data loading (io)", S.H2D: "copies to the device (h2d)"}


def cause_words(cause: Cause, step_ms: float, ranks: int = 2) -> str:
    """The cause in words, as the report's headline states it (names from the trace made safe
    to print): who (with one rank: nobody), what, its time on the critical path per step, and
    the replay without it."""
    who = f"rank {cause.rank}" if cause.rank is not None else "every rank"
    most = f" ({who} most)" if ranks > 1 else ""
    if cause.stage is not None:
        who = f"stage {cause.stage} (rank {cause.rank})"
    blamed = f"{cause.blamed_ms:.3g} ms per step"
    op = f", most of it in {safe(cause.op, 60)}" if cause.op else ""
    phase = _PHASE_WORDS.get(cause.phase or "", cause.phase)
    verb = "start" if len(cause.others) > 1 else "starts"
    late = f"{blamed} on the critical path"
    # (the idling that makes it late, apart, where it is a tenth of the blame or more)
    idle_ms = cause.idle_ms or 0.0
    if cause.kind == LATE_START and idle_ms >= 0.1 * cause.blamed_ms > 0:
        late = (
            f"{cause.blamed_ms - idle_ms:.3g} ms per step on the critical path, and "
            f"{idle_ms:.3g} ms idling there"
        )
    if cause.kind == LATE_START and cause.rank is None:
        what = f"the ranks start their steps late in turn: {late}"
    elif cause.kind == LATE_START:
        more = f" ({count_ranks(cause.others)} {verb} late too)" if cause.others else ""
        what = f"{who} starts its steps late{more}: {late}"
        if cause.before:
            what += "; meanwhile it was " + before_words(cause.before[:3])
    elif cause.change.startswith("balance:"):
        what = f"{who}'s {phase} holds the step: {blamed} on the critical path{op}"
    elif cause.kind == TRANSFER:
        group = f" (group {safe(cause.group, 40)})" if cause.group else ""
        what = f"communication is exposed: {blamed} of transfer on the critical path{op}{group}"
    elif cause.kind == S.SEGMENT_IDLE and cause.rank is None:
        what = f"the ranks idle inside their steps in turn: {blamed} on the critical path"
    elif cause.kind == S.SEGMENT_IDLE:
        more = f" ({count_ranks(cause.others)} too, for less)" if cause.others else ""
        what = f"{who} idles inside its steps: {blamed} on the critical path{more}"
    elif cause.kind == S.SEGMENT_HOST_BOUND:
        what = f"the device waits for the host: {blamed} on the critical path{most}{op}"
    elif cause.kind == S.SEGMENT_LAUNCH:
        what = f"the device waits for kernel launches: {blamed} on the critical path{most}{op}"
    else:  # a phase that is not the model's own work, on every rank
        what = f"{phase} holds {blamed} of the critical path{most}"
    how = "without it"
    if cause.change.startswith("balance:stage="):
        how = f"with stage {cause.stage} at the other stages' median"
    elif cause.change.startswith("balance:"):
        how = f"with rank {cause.rank} at the others' median"
    then = ""
    if cause.then_rank is not None:
        then = (
            f"; rank {cause.then_rank} still ends the step last"
            if cause.then_rank == cause.rank
            else f"; rank {cause.then_rank} then ends the step last (the others wait for "
            + (f"its {cause.then_phase})" if cause.then_phase else "it)")
        )
    return (
        f"{what}. Replayed {how}, the job's step would take {cause.step_ms:.3g} ms "
        f"instead of {step_ms:.3g} ms ({cause.speedup:.2f}x){then}"
    )


def before_words(before: list[Spent]) -> str:
    """Where a late rank was (``Cause.before``) in words, ms per step: the pieces of its
    previous step's end together, the time between its steps apart, the larger first."""
    ending = [spent_words(p) for p in before if p.kind != BETWEEN_STEPS]
    parts = {p.kind: p for p in before}
    between = parts.get(BETWEEN_STEPS)
    said = ["ending its previous step: " + ", ".join(ending)] if ending else []
    if between is not None:
        outside = f"between its steps (outside every step marker) {between.ms:.3g} ms"
        first = before[0].kind == BETWEEN_STEPS
        said.insert(0 if first else len(said), outside)
    return "; ".join(said)


def spent_words(spent: Spent) -> str:
    """One piece of a late rank's previous step, in words with its ms per step."""
    op = f" (most in {safe(spent.op, 40)})" if spent.op else ""
    if spent.kind == S.SEGMENT_IDLE:
        where = "idle outside every operator"
    elif spent.kind == S.SEGMENT_COMM or spent.phase == S.COMM:
        where = "communicating"
    else:
        where = str(_PHASE_WORDS.get(spent.phase or "", spent.phase))
        if spent.kind != S.SEGMENT_COMPUTE:
            where += f" ({spent.kind})"
    return f"{where} {spent.ms:.3g} ms{op}"


def cause_brief(cause: Cause) -> str:
    """The cause in one short line (what ``compare`` lists per run): what, who, what it costs."""
    who = f"rank {cause.rank}" if cause.rank is not None else "every rank"
    phase = _PHASE_WORDS.get(cause.phase or "", cause.phase)
    what = {
        LATE_START: f"{who}'s late starts",
        S.SEGMENT_IDLE: f"{who}'s idling",
        TRANSFER: "exposed communication",
        S.SEGMENT_HOST_BOUND: "the device waiting for the host",
        S.SEGMENT_LAUNCH: "the device waiting for kernel launches",
        "dispatch": "the workers idling between the steps their coordinator hands them",
        "server": f"the workers' pushes queueing at server {who}",
    }.get(cause.kind, f"{who}'s {phase}" if cause.change.startswith("balance:") else str(phase))
    return f"{what} cost {cause.ms:.3g} ms per step ({cause.speedup:.2f}x without)"


def count_ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:5])) + (" ..." if len(ranks) > 5 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}"
