"""How a job that failed failed: which rank, which step, which call, and why (issue 49).

Read from the step record every rank keeps under `collect` (schema.RECORD_*: each step, the
rank's last collective calls, where it was when it stopped, its stacks). The rank named is the one
that diverged or stopped first, not the first to time out:

- desync: a rank leaves out a collective or makes one more. Each rank's calls per step are its
  own steady count (a pipeline's stages differ, and every rank changes together where the job
  does, as an evaluation step); the first step where a minority of ranks leave theirs names them,
  and where that step's calls part from their own previous step, the call. A desync that ends in
  a hang is a desync, at the step where the sequences part;
- mismatch: at one sequence number of a group, ranks call different ops or sizes (sizes where
  every rank must pass the same: all-reduce, all-gather, reduce-scatter, broadcast); the rank
  named is the one whose call is not the call it made at that place of its previous step (a
  skipped call shows as the next one: a desync);
- crash: a rank that raised (not a collective's failure: a timeout or a peer gone is the others'
  waiting) or that ended without its exit handlers (SIGKILL, a crash in native code), first;
- hang: a rank that stopped making progress outside a collective (data loading, a checkpoint, a
  loop) while the others waited in one; or, everyone waiting, the rank that never reached the
  call the others wait in.

Times are UNIX ns of one host's clock (the record's); steps are the job's own numbers (its first
step is 0).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec
import polars as pl
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.results.failure import (
    Failure,
    FailureKind,
    RankAtEnd,
    RankTail,
    StackFrame,
    StepSpan,
)

#: A rank's end in these words is a collective failing under it: it was waiting, not the cause.
_COMM_FAILURE = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|broken pipe|peer|nccl|gloo|"
    r"processgroup|distbackenderror|watchdog",
    re.IGNORECASE,
)
_TIMEOUT_MS = re.compile(r"(?:waiting|timeout[^0-9]{0,20})\s*(\d+)\s*ms", re.IGNORECASE)
#: Calls whose sizes must agree across a group's ranks (others may differ: all-to-all splits,
#: a gather's root).
SAME_SIZE = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_reduce_coalesced")
#: A rank ended by a signal after this long without progress was stuck, not merely ended.
STUCK_S = 1.0
#: The end of a rank that had stalled and was then killed without its exit handlers.
KILLED_STUCK = "killed after it stalled (no exit handler ran)"
ASYNC, FAILED = 1, 2
#: the end state of a rank known only from its Flight Recorder dump (parsers.flight); of one
#: whose dump is missing where the others' process groups name it
DUMPED, UNDUMPED = "dumped", "undumped"


@dataclass(frozen=True)
class FailureResult:
    failure: Failure | None
    ranks_at_end: list[RankAtEnd]


def analyse_failure(
    steps: pa.Table,
    calls: pa.Table,
    ranks: pa.Table,
    job_failed: bool = False,
    job_end_ns: int | None = None,
) -> FailureResult:
    """The failure of a run from its step record (``steps``, ``calls``, ``ranks``: schema
    RECORD_*); ``job_failed``: the launcher said the job failed (its exit code); ``job_end_ns``:
    when it said the job ended. A run whose every rank finished, and whose job did not fail,
    has none."""
    step_rows = pl.from_arrow(steps)
    rank_rows = pl.from_arrow(ranks)
    assert isinstance(step_rows, pl.DataFrame) and isinstance(rank_rows, pl.DataFrame)
    call_rows = _collectives(pl.from_arrow(calls), step_rows)
    median_step_s = _median_step_s(step_rows)
    # the call each rank stood in, once (not a filter per rank: 1,024 ranks' rings)
    last_of = {row[S.RANK]: row for row in _standing_in(call_rows).iter_rows(named=True)}
    # (a rank that left no end was alive until then at least: others ended after it stood)
    latest = rank_rows[S.END_NS].max() if rank_rows.height else None
    ends = [t for t in (latest, job_end_ns) if isinstance(t, int)]
    job_end = max(ends) if ends else None
    at_end = [
        _at_end(r, last_of.get(r[S.RANK]), median_step_s, job_end)
        for r in rank_rows.iter_rows(named=True)
    ]
    if (
        at_end
        and all(a.detail in (DUMPED, UNDUMPED) for a in at_end)
        and all(a.state != "blocked" for a in at_end)
    ):  # dumps of ranks none of which waited: a hang they do not show; a mismatch they may
        at_end = [
            msgspec.structs.replace(a, state="running") if a.detail == DUMPED else a for a in at_end
        ]
        states = {a.rank: a for a in at_end}
        return FailureResult(_diverged(step_rows, call_rows, rank_rows, states), at_end)
    states = {a.rank: a for a in at_end}
    if all(a.state == "finished" for a in at_end) and not job_failed:
        return FailureResult(None, at_end)
    found = _diverged(step_rows, call_rows, rank_rows, states) or _stopped(
        call_rows, rank_rows, states
    )
    return FailureResult(found, at_end)


def rank_tails(steps: pa.Table, ranks: pa.Table, keep: int = 6) -> list[RankTail]:
    """Each rank's last ``keep`` steps of its step record and its last sign of life (its end,
    else its last progress), by rank: what the TUI draws of how a failed job ended."""
    step_rows = pl.from_arrow(steps)
    rank_rows = pl.from_arrow(ranks)
    assert isinstance(step_rows, pl.DataFrame) and isinstance(rank_rows, pl.DataFrame)
    last = (
        step_rows.sort(S.RANK, S.STEP)
        .group_by(S.RANK, maintain_order=True)
        .tail(keep)
        .group_by(S.RANK, maintain_order=True)
        .agg(S.STEP, S.START_NS, S.END_NS)
    )
    spans = {
        row[S.RANK]: [
            StepSpan(step=int(n), start_ns=int(a), end_ns=int(b))
            for n, a, b in zip(row[S.STEP], row[S.START_NS], row[S.END_NS], strict=True)
        ]
        for row in last.iter_rows(named=True)
    }
    return [
        RankTail(rank=r[S.RANK], steps=spans.get(r[S.RANK], []), end_ns=r[S.END_NS] or _alive(r))
        for r in rank_rows.sort(S.RANK).iter_rows(named=True)
    ]


# --- the calls ---------------------------------------------------------------------------------


def _collectives(calls: Any, steps: pl.DataFrame) -> pl.DataFrame:
    """The collectives (a group's sequence number) of traceview's record, or where a rank has
    none of those (DDP's, made from C++), its Flight Recorder's, each given the step it began
    in by its time (the step after the last one ended before it)."""
    assert isinstance(calls, pl.DataFrame)
    calls = calls.filter(pl.col(S.SEQ) > 0)
    own = calls.filter(pl.col(S.SOURCE) == "record")
    has_own = own[S.RANK].unique().to_list()
    flight = calls.filter((pl.col(S.SOURCE) == "flight") & ~pl.col(S.RANK).is_in(has_own))
    if flight.height and steps.height:  # (a dump alone: no steps, its calls' steps unknown)
        ended = steps.select(
            S.RANK, pl.col(S.END_NS).alias("ended"), (pl.col(S.STEP) + 1).alias("after")
        ).sort("ended")
        flight = (
            flight.sort(S.START_NS)
            .join_asof(
                ended, left_on=S.START_NS, right_on="ended", by=S.RANK, check_sortedness=False
            )
            .with_columns(pl.col("after").fill_null(0).alias(S.STEP))
            .select(calls.columns)
        )
    return pl.concat([own, flight]).sort(S.RANK, S.START_NS)


def _standing_in(calls: pl.DataFrame) -> pl.DataFrame:
    """Each rank's call where it stood at the end: its last, or in a Flight Recorder's entries
    its first that had not ended (a group runs its calls in order: a rank that issued more
    asynchronously is held in the first)."""
    ordered = calls.sort(S.RANK, S.START_NS)
    last = ordered.group_by(S.RANK, maintain_order=True).last()
    open_flight = (
        ordered.filter((pl.col(S.SOURCE) == "flight") & pl.col(S.END_NS).is_null())
        .group_by(S.RANK, maintain_order=True)
        .first()
    )
    if open_flight.height == 0:
        return last
    return pl.concat(
        [last.filter(~pl.col(S.RANK).is_in(open_flight[S.RANK].to_list())), open_flight]
    ).sort(S.RANK)


def _median_step_s(steps: pl.DataFrame) -> float:
    if steps.height == 0:
        return 0.0
    return float((steps[S.END_NS] - steps[S.START_NS]).median() or 0.0) / 1e9


# --- where each rank was -------------------------------------------------------------------------


def _at_end(
    rank: dict[str, Any], last: dict[str, Any] | None, median_step_s: float, job_end: int | None
) -> RankAtEnd:
    r = rank[S.RANK]
    state_said, detail = rank[S.END_STATE], rank[S.END_DETAIL]
    if state_said == "exception" and (detail or "").startswith("KeyboardInterrupt"):
        state_said = "signal"  # (the user's Ctrl-C ended it: not a crash of its own)
    alive = [t for t in (_alive(rank), job_end) if t]
    ended = rank[S.END_NS] or (max(alive) if alive else None)
    last_seq = int(last[S.SEQ]) if last is not None else None
    common = dict(rank=r, last_step=rank[S.STEP_NOW], last_seq=last_seq, detail=detail)
    # (inside its last collective: it had not returned, or raised; or the rank ended on a
    # collective's failure, which an async call's wait or the Flight Recorder's retired entry
    # does not show as open)
    comm_failed = state_said == "exception" and bool(_COMM_FAILURE.search(detail or ""))
    in_call = last is not None and (
        (last[S.END_NS] is None and not last[S.FLAGS] & ASYNC)
        or bool(last[S.FLAGS] & FAILED)
        or comm_failed
    )
    if state_said == "ok" and not (last is not None and last[S.FLAGS] & FAILED):
        return RankAtEnd(state="finished", **common)
    if state_said == UNDUMPED:
        return RankAtEnd(state="unknown", **{**common, "detail": UNDUMPED})
    if state_said == DUMPED:  # a Flight Recorder dump: where it stood, not since when
        common["detail"] = DUMPED
        if in_call and last is not None:
            return RankAtEnd(state="blocked", in_=_call_words(last), **common)
        return RankAtEnd(state="stuck", **common)
    if in_call and last is not None:
        since = (ended - last[S.START_NS]) / 1e9 if ended else None
        return RankAtEnd(state="blocked", in_=_call_words(last), since_s=_s(since), **common)
    if state_said is None:
        # killed without its exit handlers; where it had stalled (its watchdog's stacks) and
        # made no progress up to the job's end, it was stuck until killed: a hang's end
        still = (job_end - rank[S.PROGRESS_NS]) / 1e9 if job_end and rank[S.PROGRESS_NS] else 0
        if rank[S.STACK_REASON] == "stall" and still > max(STUCK_S, 5 * median_step_s):
            common["detail"] = common["detail"] or KILLED_STUCK
            return RankAtEnd(
                state="stuck", in_=_phase_words(rank[S.PHASE_NOW]), since_s=_s(still), **common
            )
        return RankAtEnd(state="killed", in_=_phase_words(rank[S.PHASE_NOW]), **common)
    if state_said == "exception" and not _COMM_FAILURE.search(detail or ""):
        return RankAtEnd(state="crashed", in_=_phase_words(rank[S.PHASE_NOW]), **common)
    still = (ended - rank[S.PROGRESS_NS]) / 1e9 if ended and rank[S.PROGRESS_NS] else None
    stuck = still is not None and still > max(STUCK_S, 5 * median_step_s)
    return RankAtEnd(
        state="stuck" if stuck else "killed",
        in_=_phase_words(rank[S.PHASE_NOW]),
        since_s=_s(still) if stuck else None,
        **common,
    )


def _alive(rank: dict[str, Any]) -> int | None:
    """The last sign of life of a rank that left no end: its last progress or phase change, or
    its stacks taken (a stall's, or a signal's: a rank its launcher killed after another rank
    died was alive then, though its last progress may be older than that rank's)."""
    times = [t for t in (rank[S.PROGRESS_NS], rank[S.PHASE_SINCE_NS], rank[S.STACK_NS]) if t]
    return max(times) if times else None


def _s(seconds: float | None) -> float | None:
    return None if seconds is None else round(max(seconds, 0.0), 3)


def _call_words(call: dict[str, Any]) -> str:
    return f"{call[S.OP]} #{call[S.SEQ]} (group {call[S.GROUP]})"


_PHASE_WORDS = {
    "io": "data loading",
    "checkpoint": "a checkpoint (torch.save)",
    "comm": "a collective",
    "step": "its step, outside any collective",
}


def _phase_words(phase: str | None) -> str | None:
    return _PHASE_WORDS.get(phase or "")


# --- desync and mismatch -------------------------------------------------------------------------


def _diverged(
    steps: pl.DataFrame, calls: pl.DataFrame, ranks: pl.DataFrame, states: dict[int, RankAtEnd]
) -> Failure | None:
    by_count = _count_divergence(steps, calls, ranks)
    by_call = _call_divergence(calls, ranks)
    found = [f for f in (by_count, by_call) if f is not None]
    if not found:
        return None
    first = min(found, key=lambda f: f.step if f.step is not None else 1 << 62)
    waiting = [a.rank for a in states.values() if a.state == "blocked" and a.rank != first.rank]
    return _with(first, waiting=waiting, evidence=_evidence(first, states, _ends(ranks)))


def _count_divergence(
    steps: pl.DataFrame, calls: pl.DataFrame, ranks: pl.DataFrame
) -> Failure | None:
    """The first step where a minority of ranks make another number of calls than their own
    usual (their most frequent count), while the rest keep theirs."""
    if steps.height == 0 or steps[S.RANK].n_unique() < 2:
        return None
    usual = steps.group_by(S.RANK).agg(pl.col(S.CALLS).mode().min().alias("usual"))
    marked = steps.join(usual, on=S.RANK).with_columns(off=pl.col(S.CALLS) != pl.col("usual"))
    per_step = (
        marked.group_by(S.STEP)
        .agg(pl.col("off").sum().alias("off"), pl.len().alias("n"))
        # (a minority leaves its count; of two ranks, the one that left its own)
        .filter(
            (pl.col("off") > 0)
            & ((pl.col("off") * 2 < pl.col("n")) | ((pl.col("n") == 2) & (pl.col("off") == 1)))
        )
        .sort(S.STEP)
    )
    if per_step.height == 0:
        return None
    step = int(per_step[S.STEP][0])
    off = marked.filter((pl.col(S.STEP) == step) & pl.col("off")).sort(S.RANK).row(0, named=True)
    rank, made, usual_n = int(off[S.RANK]), int(off[S.CALLS]), int(off["usual"])
    where = _parting_call(calls, rank, step)
    fewer = made < usual_n
    n = abs(usual_n - made)
    if where is not None:
        what, _ = where
    else:
        what = f"made {made} calls where it makes {usual_n}"
    detail = (
        f"the job desynchronized at step {step}: rank {rank} {what}, and ran "
        f"{n} collective{'s' if n > 1 else ''} {'ahead of' if fewer else 'behind'} the others "
        "from there on (calls with equal shapes pair silently with the wrong ones)"
    )
    return Failure(
        kind="desync", rank=rank, step=step, detail=detail,
        seq=int(where[1][S.SEQ]) if where else None,
        op=str(where[1][S.OP]) if where else None,
        group=str(where[1][S.GROUP]) if where else None,
        phase="comm",
    )  # fmt: skip


def _parting_call(calls: pl.DataFrame, rank: int, step: int) -> tuple[str, dict[str, Any]] | None:
    """Where ``rank``'s collectives of ``step`` part from those of its step before: in words
    (the call and its place in the step, or the places equal calls leave open) and the call of
    the step before that it left out, or its own extra one."""
    mine = calls.filter(pl.col(S.RANK) == rank)
    now = mine.filter(pl.col(S.STEP) == step).sort(S.START_NS)
    before = mine.filter(pl.col(S.STEP) == step - 1).sort(S.START_NS)
    if before.height == 0:
        return None
    a = list(zip(now[S.OP], now[S.GROUP], now[S.BYTES], strict=True))
    b = list(zip(before[S.OP], before[S.GROUP], before[S.BYTES], strict=True))
    longer, shorter, table = (b, a, before) if len(b) > len(a) else (a, b, now)
    if len(longer) != len(shorter) + 1:
        return None
    # the places whose removal from the longer list leaves the shorter one (prefix, suffix)
    places = [i for i in range(len(longer)) if longer[:i] + longer[i + 1 :] == shorter]
    if not places:
        return None
    row = table.row(places[0], named=True)
    if len(longer) == len(b):  # (left out: its sequence number is the one it used instead)
        seq_now = now.row(places[0], named=True)[S.SEQ] if places[0] < len(a) else None
        row = {**row, S.SEQ: seq_now if seq_now is not None else row[S.SEQ]}
    first, last = places[0] + 1, places[-1] + 1
    op, call = row[S.OP], f"call {row[S.SEQ]} of group {row[S.GROUP]}"
    left_out = len(longer) == len(b)
    if first == last:
        what = f"left out {op} #{first}" if left_out else f"made an extra {op}, #{first}"
        return f"{what} of the step ({call})", row
    what = (
        f"left out one of its equal {op} calls"
        if left_out
        else f"made an extra {op} among its equal calls"
    )
    return (
        f"{what} #{first}-#{last} of the step (which one, the record cannot tell; the "
        f"sequences part from {call})",
        row,
    )


def _call_divergence(calls: pl.DataFrame, ranks: pl.DataFrame) -> Failure | None:
    """The first (group, sequence number) whose calls differ across ranks in op, or in size
    where sizes must agree."""
    if calls.height == 0 or calls[S.RANK].n_unique() < 2:
        return None
    same_size = [op for op in calls[S.OP].unique().to_list() if op and _sizes_agree(op)]
    keyed = calls.with_columns(
        key=pl.when(pl.col(S.OP).is_in(same_size))
        .then(pl.col(S.OP) + ":" + pl.col(S.BYTES).cast(pl.String).fill_null("?"))
        .otherwise(pl.col(S.OP))
        # (where the Flight Recorder says where the job made every call: two calls of one op
        # and size from two places in the code are two different calls)
        + (("@" + pl.col(S.SITE)) if calls[S.SITE].null_count() == 0 else pl.lit(""))
    )
    # (only sequence numbers every rank of the group holds in its record)
    differ = (
        keyed.group_by(S.GROUP, S.SEQ)
        .agg(pl.col("key").n_unique().alias("kinds"), pl.col(S.START_NS).min().alias("t"))
        .filter(pl.col("kinds") > 1)
        .sort("t")
    )
    if differ.height == 0:
        return None
    group, seq = differ.row(0)[:2]
    here = keyed.filter(pl.col(S.GROUP).eq_missing(group) & (pl.col(S.SEQ) == seq))
    counts = here.group_by("key").agg(pl.col(S.RANK).sort().alias("ranks"), pl.len().alias("n"))
    own = {r: _own_place(keyed, r, group, seq) for r in here[S.RANK].to_list()}
    # the rank whose call is not the one it made at that place of its previous step; else the
    # minority's first rank
    strays = [r for r, (was, _) in own.items() if was is not None and was != _key(here, r)]
    if len(strays) == 1:
        rank = strays[0]
    else:
        smallest = counts.sort("n", descending=False).row(0, named=True)
        rank = int(smallest["ranks"][0])
    row = here.filter(pl.col(S.RANK) == rank).row(0, named=True)
    others = here.filter(pl.col("key") != row["key"])
    other = others.row(0, named=True) if others.height else row
    _, following = own.get(rank, (None, None))
    if following is None:  # (no steps: the others' next call, where it stands in this one's place)
        following = _others_next(keyed, rank, group, seq, row["key"])
    step = row[S.STEP]
    position = _position(keyed, rank, group, seq)
    at = f"call {seq} of group {group}" + (
        f", #{position} of step {step}" if position is not None and step is not None else ""
    )
    if following is not None and following == row["key"]:
        kind: FailureKind = "desync"
        detail = (
            f"the job desynchronized{_at(step)}: rank {rank} left out "
            f"{other[S.OP]} ({_bytes(other[S.BYTES])}{_made_at(other)}) and called the next "
            f"collective {row[S.OP]} ({_bytes(row[S.BYTES])}{_made_at(row)}) in its place ({at})"
        )
    else:
        kind = "mismatch"
        same_place = row.get(S.SITE) == other.get(S.SITE)
        sites = ("", "") if same_place else (_made_at(row), _made_at(other))
        detail = (
            f"collectives mismatched{_at(step)}: rank {rank} called {row[S.OP]} "
            f"({_bytes(row[S.BYTES])}{sites[0]}) where the others called {other[S.OP]} "
            f"({_bytes(other[S.BYTES])}{sites[1]}) ({at})"
        )
    return Failure(
        kind=kind, rank=rank, step=step, detail=detail, seq=int(seq), op=str(row[S.OP]),
        group=str(group), phase="comm",
    )  # fmt: skip


#: Spellings of one collective in backends' and the Flight Recorder's names
_SPELLED = {"allgather": "all_gather", "allreduce": "all_reduce", "reducescatter": "reduce_scatter"}


def _sizes_agree(op: str) -> bool:
    """Whether every rank's call of ``op`` moves as many bytes: its base collective is one of
    SAME_SIZE, however spelled (``_broadcast_oop``, ``ALLGATHER_coalesced``,
    ``_reduce_scatter_base``, ``all_gather_into_tensor_coalesced``)."""
    base = op.lower().lstrip("_")
    for part in ("_coalesced", "_oop", "_base", "_into_tensor", "_tensor"):
        base = base.replace(part, "")
    return _SPELLED.get(base, base) in SAME_SIZE


def _others_next(keyed: pl.DataFrame, rank: int, group: str, seq: int, key: str) -> str | None:
    """``key`` where the other ranks' call after ``seq`` (most of them agree on it) is this
    one: the rank made that call in the place of the one it left out; else None."""
    following = keyed.filter(
        pl.col(S.GROUP).eq_missing(group) & (pl.col(S.SEQ) == seq + 1) & (pl.col(S.RANK) != rank)
    )["key"]
    if following.is_empty():
        return None
    most = following.mode().sort()[0]
    return key if most == key else None


def _made_at(call: dict[str, Any]) -> str:
    return f", at {call[S.SITE]}" if call.get(S.SITE) else ""


def _key(rows: pl.DataFrame, rank: int) -> str:
    return str(rows.filter(pl.col(S.RANK) == rank)["key"][0])


def _position(keyed: pl.DataFrame, rank: int, group: str, seq: int) -> int | None:
    mine = keyed.filter((pl.col(S.RANK) == rank) & pl.col(S.GROUP).eq_missing(group))
    row = mine.filter(pl.col(S.SEQ) == seq)
    if row.height == 0 or row[S.STEP][0] is None:
        return None
    step = row[S.STEP][0]
    first = mine.filter(pl.col(S.STEP) == step)[S.SEQ].min()
    return int(seq - first + 1) if first is not None else None  # type: ignore[operator]


def _own_place(
    keyed: pl.DataFrame, rank: int, group: str, seq: int
) -> tuple[str | None, str | None]:
    """The calls ``rank`` made, in its previous step, at the place in the step of its call
    ``seq`` and at the place after it (None where not recorded)."""
    position = _position(keyed, rank, group, seq)
    mine = keyed.filter((pl.col(S.RANK) == rank) & pl.col(S.GROUP).eq_missing(group))
    step = mine.filter(pl.col(S.SEQ) == seq)[S.STEP]
    if position is None or step.is_empty() or step[0] is None:
        return None, None
    before = mine.filter(pl.col(S.STEP) == step[0] - 1).sort(S.SEQ)["key"].to_list()
    at = before[position - 1] if position - 1 < len(before) else None
    after = before[position] if position < len(before) else None
    return at, after


def _bytes(value: int | None) -> str:
    if value is None:
        return "? bytes"
    return f"{value / 1024:.0f} KiB" if value >= 1024 else f"{value} bytes"


# --- hangs and crashes -------------------------------------------------------------------------


def _stopped(
    calls: pl.DataFrame, ranks: pl.DataFrame, states: dict[int, RankAtEnd]
) -> Failure | None:
    rows = {r[S.RANK]: r for r in ranks.iter_rows(named=True)}
    waiting = sorted(a.rank for a in states.values() if a.state == "blocked")
    waited_in = _waited_call(calls, waiting)
    candidates = []
    for a in states.values():
        row = rows[a.rank]
        if a.state in ("crashed", "killed") and (a.state == "crashed" or row[S.END_STATE] is None):
            candidates.append((row[S.END_NS] or _alive(row) or 0, a))
        elif a.state == "stuck":
            candidates.append((row[S.PROGRESS_NS] or 0, a))
    if not candidates and waiting and waited_in is not None:
        # everyone waits: the rank that never reached the call the others wait in
        group, seq = waited_in[S.GROUP], waited_in[S.SEQ]
        behind = [
            a for a in states.values()
            if a.rank not in _ranks_in(calls, group, seq)
        ]  # fmt: skip
        candidates = [(rows[a.rank][S.PROGRESS_NS] or 0, a) for a in behind]
    if not candidates:
        return None
    _, root = min(candidates, key=lambda c: (c[0], c[1].rank))
    row = rows[root.rank]
    others = [w for w in waiting if w != root.rank]
    if waited_in is not None:  # a rank killed inside that call (its launcher's doing, the call
        # ended by the root's death: gloo's Flight Recorder retires it) waited for it too
        made = _ranks_in(calls, waited_in[S.GROUP], waited_in[S.SEQ])
        others = sorted(
            {*others}
            | {a.rank for a in states.values()
               if a.rank != root.rank and a.state == "killed" and a.rank in made
               and a.last_seq == waited_in[S.SEQ]}
        )  # fmt: skip
    stack = _stack(ranks, root.rank)
    where = _frame_words(stack)
    call = ""
    if waited_in is not None and others:
        position, their_step = waited_in.get("position"), waited_in.get(S.STEP)
        of = "that step" if their_step == root.last_step else f"step {their_step}"
        nth = f" #{position} of {of}" if position and their_step is not None else ""
        call = (
            f"; {_ranks_words(others)} waited for it in {waited_in[S.OP]}{nth} (call "
            f"{waited_in[S.SEQ]} of group {waited_in[S.GROUP]})" + _until(states, others)
        )
    step = root.last_step
    if root.state == "unknown":
        kind: FailureKind = "hang"
        detail = (
            f"the job hung{_at(step)}: rank {root.rank} left no Flight Recorder dump (it died, "
            f"or hung where it could not dump){call}"
        )
    elif root.state == "stuck":
        kind = "hang"
        since = f" {root.since_s:.1f} s" if root.since_s else ""
        detail = f"the job hung{_at(step)}: rank {root.rank} was stuck{since} {_outside(root)}{where}{call}"
    else:
        kind = "crash"
        if root.state == "crashed" and root.detail:
            detail = (
                f"rank {root.rank} raised{_at(step)}: {_exception_words(root.detail)}{where}{call}"
            )
        else:
            detail = (
                f"rank {root.rank} was killed{_at(step)} (it ended without running its exit "
                f"handlers: SIGKILL, the out-of-memory killer, a crash in native code){where}{call}"
            )
    failure = Failure(
        kind=kind, rank=root.rank, step=step, detail=detail,
        seq=int(waited_in[S.SEQ]) if waited_in is not None and others else None,
        op=str(waited_in[S.OP]) if waited_in is not None and others else None,
        group=str(waited_in[S.GROUP]) if waited_in is not None and others else None,
        phase=_phase_of(row[S.PHASE_NOW]), stack=stack, waiting=others,
    )  # fmt: skip
    return _with(failure, evidence=_evidence(failure, states, _ends(ranks)))


def _at(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def _outside(rank: RankAtEnd) -> str:
    if rank.in_:
        return f"in {rank.in_}"
    if rank.detail == DUMPED:
        return "outside any collective (its Flight Recorder dump says no more)"
    return "in its step"


def _waited_call(calls: pl.DataFrame, waiting: list[int]) -> dict[str, Any] | None:
    """The call most waiting ranks were blocked in (their last), with its place in the step."""
    if not waiting:
        return None
    last = _standing_in(calls.filter(pl.col(S.RANK).is_in(waiting)))
    if last.height == 0:
        return None
    top = (
        last.group_by(S.GROUP, S.SEQ, S.OP).agg(pl.len().alias("n"), pl.col(S.RANK).min())
        .sort(["n", S.SEQ], descending=[True, False]).row(0, named=True)
    )  # fmt: skip
    one = last.filter(pl.col(S.RANK) == top[S.RANK]).row(0, named=True)
    top[S.STEP] = one[S.STEP]
    top["position"] = _position(
        calls.with_columns(key=pl.col(S.OP)), one[S.RANK], one[S.GROUP], one[S.SEQ]
    )
    return top


def _ranks_in(calls: pl.DataFrame, group: str, seq: int) -> set[int]:
    return set(
        calls.filter(pl.col(S.GROUP).eq_missing(group) & (pl.col(S.SEQ) >= seq))[S.RANK].to_list()
    )


def _until(states: dict[int, RankAtEnd], waiting: list[int]) -> str:
    """`` until the N s timeout`` where a waiting rank's end names its timeout."""
    for w in waiting:
        found = _TIMEOUT_MS.search(states[w].detail or "")
        if found:
            return f" until the {int(found.group(1)) / 1000:g} s timeout"
    return ""


def _ranks_words(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) <= 6:
        return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
    return f"{len(ranks)} ranks"


def _phase_of(phase: str | None) -> Any:
    return {"io": S.IO, "comm": S.COMM, "checkpoint": S.OTHER}.get(phase or "")


def _stack(ranks: pl.DataFrame, rank: int) -> list[StackFrame]:
    """The rank's main thread when it stopped, innermost last (at most 12 frames)."""
    text = ranks.filter(pl.col(S.RANK) == rank)[S.STACK]
    if text.is_empty() or text[0] is None:
        return []
    try:
        frames = json.loads(text[0])
    except ValueError:
        return []
    out = []
    for f in frames if isinstance(frames, list) else []:
        if not isinstance(f, dict) or _OURS.search(str(f.get("file", ""))):
            continue  # (traceview's own wrappers: not where the script stands)
        line = f.get("line")
        out.append(
            StackFrame(
                file=str(f.get("file", "?")), line=line if isinstance(line, int) else None,
                function=str(f.get("function", "?")), code=str(f.get("code", "")),
            )
        )  # fmt: skip
    return out[-12:]


#: Frames of these are the library's, not where the script stands.
_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python3")
_OURS = re.compile(r"_traceview_rankside|collectors/rankside")


def _frame_words(stack: list[StackFrame]) -> str:
    """`` (train.py:12 in batch: time.sleep(60))``: the innermost frame of the script's own."""
    own = [f for f in stack if not _LIBRARY.search(f.file)]
    if not own:
        return ""
    f = own[-1]
    name = f.file.rsplit("/", 1)[-1]
    code = f": {f.code}" if f.code else ""
    return f" ({name}:{f.line} in {f.function}{code})"


def _evidence(failure: Failure, states: dict[int, RankAtEnd], ends: dict[int, int | None]) -> str:
    """Which evidence the verdict followed, and where a launcher's own view (the first rank to
    fail: ``ends``, each rank's end) differs from it."""
    if states and all(a.detail in (DUMPED, UNDUMPED) for a in states.values()):
        said = (
            "the Flight Recorder dumps of every rank (each rank's last collectives, by process "
            "group and sequence number; no steps: a dump does not number them)"
        )
    else:
        said = "the step record of every rank (steps, calls, where each stopped, stacks)"
    failed = [
        a for a in states.values()
        if a.state == "blocked" and a.detail and ends.get(a.rank) is not None
    ]  # fmt: skip
    if failed and failure.rank is not None and all(a.rank != failure.rank for a in failed):
        first = min(failed, key=lambda a: (ends[a.rank], a.rank))
        said += (
            f"; a launcher sees rank {first.rank} fail first ({_short(first.detail)}), but it "
            f"was waiting for rank {failure.rank}"
        )
    return said


#: A line of a message that names an exception (``RuntimeError: ...``), as a framework's error
#: quotes the one it wraps: TensorFlow's a Python function's inside the graph, with its traceback.
_RAISED_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b:?.*$", re.M)


def _exception_words(detail: str, width: int = 240) -> str:
    """An exception's message on one line: its first, and where it quotes another exception
    further down (with a traceback), that one's line too."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    if not lines:
        return detail
    said = lines[0]
    inner = _RAISED_LINE.findall("\n".join(lines[1:]))
    if inner and inner[-1] not in said:
        said = f"{said} … {inner[-1]}"
    return _short(said, width)


def _short(detail: str | None, width: int = 100) -> str:
    """An exception's words without the source paths gloo and NCCL put in front of them."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|py):\d+\]\s*", "", detail or "")
    return text if len(text) <= width else text[: width - 1] + "…"


def _ends(ranks: pl.DataFrame) -> dict[int, int | None]:
    return dict(zip(ranks[S.RANK].to_list(), ranks[S.END_NS].to_list(), strict=True))


def _with(failure: Failure, **changes: Any) -> Failure:
    import msgspec

    return msgspec.structs.replace(failure, **changes)
