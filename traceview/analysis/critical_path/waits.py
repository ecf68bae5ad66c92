"""The calls as the graph takes them (``_calls``: instance, queue, transfer), the exposed
communication cut into pieces that wait for them (``_waiting_pieces``, ``_released_early``),
where each call was issued, and the steps whose communication no call explains."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceview.analysis.critical_path.graph import NEVER, NO_STEP
from traceview.analysis.crossrank import ISSUED, POINT_TO_POINT, Matched
from traceview.model import schema as S


def _composite(rank: np.ndarray, t: np.ndarray, t0: int, span: int) -> np.ndarray:
    return rank.astype(np.int64) * span + (t - t0)


#: Why a step's path is incomplete where its communication is not all explained.
UNMATCHED_CALL = "a call was left unmatched"
NO_CALL = (
    "communication without a matched call (ranks missing from the run, or calls the trace does "
    "not show): its wait and transfer are unknown, read as the rank's own time"
)


def _unexplained(
    communicating: pl.DataFrame, calls: pl.DataFrame, matched: Matched, alone: bool
) -> dict[int, str]:
    """Steps in which a call was left unmatched, or (in a world of more than one rank) a rank
    spent time communicating (exposed communication, communication kernels) without one
    matched call to explain it."""
    out = {s: UNMATCHED_CALL for s in matched.unknown_steps[S.STEP].drop_nulls().to_list()}
    if alone:
        return out
    with_calls = calls.select(pl.col(S.RANK).cast(pl.Int32), pl.col(S.STEP).fill_null(NO_STEP))
    without = communicating.with_columns(pl.col(S.RANK).cast(pl.Int32)).join(
        with_calls.unique(), on=[S.RANK, S.STEP], how="anti"
    )
    for step in without[S.STEP].unique().to_list():
        out.setdefault(step, NO_CALL)
    return out


def _calls(matched: pl.DataFrame) -> pl.DataFrame:
    """The matched calls as the graph needs them: instance, queue, the call before on the queue,
    transfer and whether the call waits for every member."""
    schema = {
        S.RANK: pl.Int32, S.STEP: pl.Int64, S.COLLECTIVE: pl.String, ISSUED: pl.Int64,
        S.END_NS: pl.Int64, "last_arrival_ns": pl.Int64, "last_rank": pl.Int32,
        "instance": pl.Int64, "queue": pl.Int64, "prev": pl.Int64, "prev_end": pl.Int64,
        "transfer": pl.Int64, "uses_all": pl.Boolean, S.BYTES: pl.Int64, "participants": pl.Int64,
    }  # fmt: skip
    if matched.height == 0:
        return pl.DataFrame(schema=schema)
    df = matched
    if "peer_rank" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.Int32).alias("peer_rank"))
    p2p = pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT)
    send = pl.col(S.COLLECTIVE) == "send"
    df = df.with_columns(
        pl.when(send).then(pl.col(S.RANK)).otherwise(pl.col("peer_rank")).alias("_src"),
        pl.when(send).then(pl.col("peer_rank")).otherwise(pl.col(S.RANK)).alias("_dst"),
    ).with_columns(
        pl.when(p2p)
        .then(pl.concat_str([pl.lit("p"), "_src", "_dst", "step_key", "position"], separator=":"))
        .otherwise(
            pl.concat_str(
                [pl.lit("c"), "group_key", S.NAME, S.COLLECTIVE, "step_key", "position"],
                separator=":",
            )
        )
        .rank("dense")
        .cast(pl.Int64)
        .alias("instance"),
        pl.struct(S.RANK, S.PID, S.TID).rank("dense").cast(pl.Int64).alias("queue"),
    )
    # a send is done when its receive is (where that came after the send was issued: not a
    # pair matched out of place): what its span lasts beyond that is the runtime getting round
    # to its completion (gloo waits for its sends at the end of a schedule)
    received = pl.col(S.END_NS).filter(pl.col(S.COLLECTIVE) == "recv").max().over("instance")
    df = df.with_columns(
        pl.when(send & (received >= pl.col(ISSUED)))
        .then(pl.min_horizontal(S.END_NS, received))
        .otherwise(S.END_NS)
        .alias(S.END_NS)
    )
    # a queue runs its calls one after the other: where a call ended before the one begun
    # before it, the thread is no queue there (gloo names the threads of its asynchronous
    # work by ids it reuses): a new queue starts with that call
    df = df.sort("queue", S.START_NS, S.END_NS)
    out_of_order = pl.col(S.END_NS) < pl.col(S.END_NS).shift(1).over("queue")
    df = df.with_columns(
        pl.struct("queue", out_of_order.fill_null(False).cum_sum().over("queue"))
        .rank("dense")
        .cast(pl.Int64)
        .alias("queue")
    ).with_row_index("_id")
    df = _timing(
        df.with_columns(
            pl.col("_id").shift(1).over("queue").cast(pl.Int64).fill_null(-1).alias("prev"),
            pl.col(S.END_NS).shift(1).over("queue").fill_null(NEVER).alias("prev_end"),
        )
    )
    if S.BYTES not in df.columns:
        df = df.with_columns(pl.lit(None, pl.Int64).alias(S.BYTES))
    return df.select(
        pl.col(S.RANK).cast(pl.Int32), pl.col(S.STEP).cast(pl.Int64), S.COLLECTIVE,
        pl.col(ISSUED).cast(pl.Int64), pl.col(S.END_NS).cast(pl.Int64),
        pl.col("last_arrival_ns").cast(pl.Int64), pl.col("last_rank").cast(pl.Int32),
        "instance", "queue", "prev", pl.col("prev_end").cast(pl.Int64), "transfer", "uses_all",
        pl.col(S.BYTES).cast(pl.Int64), pl.col("participants").cast(pl.Int64),
    )  # fmt: skip


def _timing(calls: pl.DataFrame) -> pl.DataFrame:
    """Whether each call waits for every member (its end is past the last arrival) and its
    transfer: from the later of what drove it (the last arrival, or its own issue where it
    ended before that) and the call before it on its queue, to its end."""
    uses_all = pl.col(S.END_NS) >= pl.col("last_arrival_ns")
    driver = pl.max_horizontal(
        pl.when(uses_all).then(pl.col("last_arrival_ns")).otherwise(pl.col(ISSUED)),
        pl.col("prev_end"),
    )
    return calls.with_columns(
        uses_all.alias("uses_all"),
        (pl.col(S.END_NS) - driver).clip(lower_bound=0).alias("transfer"),
    )


def _received_when_waited(calls: pl.DataFrame, pieces: pl.DataFrame) -> pl.DataFrame:
    """A receive posted before its rank began waiting for it is issued, as the graph takes it,
    when that wait began: a message moves once both sides are in it (NCCL's kernels meet;
    gloo's receiving thread, on a loaded machine, completes it only once its rank waits), so
    where the send came first its transfer is the wait, never the time its rank spent on other
    work before asking (where the send came later, it still drives the receive). Without this,
    a replay that speeds the receiver up keeps it waiting for a message long sent."""
    recv = (calls[S.COLLECTIVE] == "recv").to_numpy()
    waited = pieces.filter(pl.col("call") >= 0)
    if not recv.any() or waited.height == 0:
        return calls
    first = waited.group_by("call").agg(pl.col(S.START_NS).min())
    began = np.full(calls.height, NEVER, np.int64)
    began[first["call"].to_numpy()] = first[S.START_NS].to_numpy()
    issued = calls[ISSUED].to_numpy()
    later = recv & (began > issued)
    if not later.any():
        return calls
    moved = calls.with_columns(pl.Series(ISSUED, np.where(later, began, issued), pl.Int64))
    p2p = pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT)
    last = pl.col(ISSUED).max().over("instance")
    moved = moved.with_columns(
        pl.when(p2p).then(last).otherwise(pl.col("last_arrival_ns")).alias("last_arrival_ns"),
        pl.when(p2p)
        .then(pl.col(S.RANK).sort_by(ISSUED).last().over("instance"))
        .otherwise(pl.col("last_rank"))
        .alias("last_rank"),
    )
    return _timing(moved)


def _released_early(pieces: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """Exposed communication inside a call's flight that no call's end cuts: a piece waiting
    for no call, begun after the rank's first call ending after it was issued, waits for that
    call, released ``early`` ns before the call's end (the replay keeps that lead), where

    - the call's last member arrived during the piece: gloo's worker thread, descheduled on a
      loaded machine, can close a call's span milliseconds after the training thread's wait
      returned (and the thread may wake and wait again); or
    - the rank stays in communication from the piece to the piece the call's end cuts (one
      unbroken stretch of exposed communication): a framework that runs the collective on the
      calling thread (TensorFlow's ring all-reduce) cuts the call's span into regions of its
      own (``Loop``, ``ExecuteAsync``), of which only the last holds the call's end.

    Counted as the rank's own time, no what-if could shorten them. (A rank's own communication
    work while a call is in flight, such as issuing the next one between its backward's
    operators, is neither.)"""
    pieces = pieces.with_columns(pl.lit(0, pl.Int64).alias("early"))
    tails = pieces.with_row_index("_p").filter(pl.col("call") < 0)
    if tails.height == 0 or calls.height == 0:
        return pieces
    c_rank, c_end = calls[S.RANK].to_numpy(), calls[S.END_NS].to_numpy()
    issued, last = calls[ISSUED].to_numpy(), calls["last_arrival_ns"].to_numpy()
    rank, ps, pe = (tails[c].to_numpy() for c in (S.RANK, S.START_NS, S.END_NS))
    t0 = int(min(c_end.min(), pe.min()))
    span = int(max(c_end.max(), pe.max()) - t0 + 1)
    keys = _composite(c_rank, c_end, t0, span)
    order = np.argsort(keys, kind="stable")
    pos = np.searchsorted(keys[order], _composite(rank, pe, t0, span), side="right")
    c = order[np.minimum(pos, len(order) - 1)]  # the rank's first call ending after the piece
    ok = (pos < len(order)) & (c_rank[c] == rank) & (issued[c] <= ps)
    arrived = (ps < last[c]) & (last[c] <= pe)
    stretch = _stretch_ids(pieces)
    cut = pieces["call"].to_numpy()
    held = np.unique(stretch[cut >= 0] * (calls.height + 1) + cut[cut >= 0])
    in_call = np.isin(stretch[tails["_p"].to_numpy()] * (calls.height + 1) + c, held)
    ok &= arrived | in_call
    if not ok.any():
        return pieces
    at = tails["_p"].to_numpy()[ok]
    call = cut.copy()
    early = np.zeros(pieces.height, np.int64)
    call[at] = c[ok]
    early[at] = c_end[c[ok]] - pe[ok]
    return pieces.with_columns(
        pl.Series("call", call, pl.Int64), pl.Series("early", early, pl.Int64)
    )


def _stretch_ids(pieces: pl.DataFrame) -> np.ndarray:
    """Per piece, its unbroken stretch of exposed communication: a rank's pieces where each
    starts at the end of the one before it (the pieces in (rank, start) order)."""
    order = np.lexsort((pieces[S.START_NS].to_numpy(), pieces[S.RANK].to_numpy()))
    rank = pieces[S.RANK].to_numpy()[order]
    start, end = pieces[S.START_NS].to_numpy()[order], pieces[S.END_NS].to_numpy()[order]
    new = np.ones(len(order), bool)
    new[1:] = (rank[1:] != rank[:-1]) | (start[1:] != end[:-1])
    ids = np.empty(len(order), np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def _waiting_pieces(comm: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """Exposed communication cut at the ends of the rank's calls inside it: the piece before a
    call's end waits for that call (``call``); what is left after the last end waits for none."""
    if comm.height == 0 or calls.height == 0:
        return comm.with_columns(pl.lit(-1, pl.Int64).alias("call"))
    c_rank, c_end = calls[S.RANK].to_numpy(), calls[S.END_NS].to_numpy()
    rank, lo_t, hi_t = (comm[c].to_numpy() for c in (S.RANK, S.START_NS, S.END_NS))
    t0 = int(min(c_end.min(), lo_t.min()))
    span = int(max(c_end.max(), hi_t.max()) - t0 + 1)
    keys = _composite(c_rank, c_end, t0, span)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    lo = np.searchsorted(keys, _composite(rank, lo_t, t0, span), side="right")
    hi = np.searchsorted(keys, _composite(rank, hi_t, t0, span), side="right")
    counts = hi - lo
    seg = np.repeat(np.arange(comm.height), counts)
    within = np.arange(len(seg)) - np.repeat(np.cumsum(counts) - counts, counts)
    cut_call = order[np.repeat(lo, counts) + within]
    cut_at = c_end[cut_call]
    # every segment also ends at its own end (a piece waiting for none, where the last call's
    # end falls short of it)
    seg = np.concatenate([seg, np.arange(comm.height)])
    cut_at = np.concatenate([cut_at, hi_t])
    cut_call = np.concatenate([cut_call, np.full(comm.height, -1)])
    by = np.lexsort((cut_call < 0, cut_at, seg))
    seg, cut_at, cut_call = seg[by], cut_at[by], cut_call[by]
    first = np.ones(len(seg), bool)
    first[1:] = seg[1:] != seg[:-1]
    prev_cut = np.where(first, lo_t[seg], np.roll(cut_at, 1))
    keep = (cut_call >= 0) | (cut_at > prev_cut) | first
    seg, cut_at, cut_call, prev_cut = seg[keep], cut_at[keep], cut_call[keep], prev_cut[keep]
    return comm[seg].with_columns(
        pl.Series(S.START_NS, prev_cut, pl.Int64),
        pl.Series(S.END_NS, cut_at, pl.Int64),
        pl.Series("call", cut_call, pl.Int64),
    )


def _issue_points(calls: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """Where each call was issued on its rank's timeline: the item that held that instant and
    how far into it (-1: outside the counted windows, where its arrival stays as measured)."""
    if calls.height == 0:
        return calls.with_columns(
            pl.lit(-1, pl.Int64).alias("issue_item"), pl.lit(0, pl.Int64).alias("issue_offset")
        )
    rank, start, end = (items[c].to_numpy() for c in (S.RANK, S.START_NS, S.END_NS))
    c_rank, issued = calls[S.RANK].to_numpy(), calls[ISSUED].to_numpy()
    t0 = int(min(start.min(), issued.min()))
    span = int(max(end.max(), issued.max()) - t0 + 1)
    keys = _composite(rank, start, t0, span)
    at = _composite(c_rank, issued, t0, span)
    pos = np.searchsorted(keys, at, side="right") - 1
    safe = np.maximum(pos, 0)
    inside = (pos >= 0) & (rank[safe] == c_rank) & (issued < end[safe])
    # an instant at an item's end, with nothing after it on the rank, is still that item's
    inside |= (pos >= 0) & (rank[safe] == c_rank) & (issued == end[safe])
    item = np.where(inside, safe, -1)
    offset = np.where(inside, issued - start[safe], 0)
    return calls.with_columns(
        pl.Series("issue_item", item, pl.Int64), pl.Series("issue_offset", offset, pl.Int64)
    )
