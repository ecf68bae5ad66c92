"""Across ranks: collective calls matched with their counterparts, and communication split into
waiting for the last rank and transfer.

Runs on the per-rank tables (``collectives``, ``comm`` and ``steps``), never on events, so it
costs the same whatever the traces weigh. Vectorized with polars: a join per process group and
view, no per-call Python.

Matching. A rank's n-th call of a view (``c10d::allreduce_`` on the training thread,
``gloo:all_reduce`` on gloo's threads, an NCCL kernel on a stream, a KVStore round) in a step is
the n-th call of that view in that step on every other rank of its process group (where the
trace names one; else all ranks that make calls of that view). Keying by step rather than by a
rank's running count keeps matching right when a rank's profile starts a step later or a rank
dies: a key that not every participant has is left unmatched and counted, never guessed.

Launch views. A call can be seen twice on one rank: where the program makes it
(``c10d::allreduce_``, ``record_param_comms``, an ``nccl:*`` annotation: asynchronous, they
return once the work is queued) and where it runs (gloo's thread, the NCCL kernel on a stream).
Only the second waits for the other ranks, so a host view is a launch view, left out of the
waits and of the clock estimate, where the run has a device view of the same collective or a
host view of it that takes at least ``LAUNCH_RATIO`` times as long (decided over all ranks, so
a view is left out on every rank or on none).

Waiting and transfer. In a matched call the last rank to arrive decides when anyone can finish:
on each rank, the time inside the call before the last arrival is **wait**, the rest
**transfer** (on the last rank itself all of it is transfer). A rank's wait intervals, laid over
its communication (``comm``: the union of its comm time per step, cut into exposed and hidden
pieces), split both the exposed communication of the breakdown and all of it, so wait that was
hidden behind backward never counts as the cause of a slow step.

Clocks. Arrival times are only comparable on one clock. Ranks on one host share it, and
``collect`` measures each rank's offset from the launcher's clock (applied at ingest); traces
read on their own from several hosts keep their hosts' clocks, which can be milliseconds apart.
For those the offsets are estimated from the matched synchronizing collectives (``SYNCHRONIZING``:
no rank can leave one before the last rank arrived, and all leave within a transfer of each
other): per rank, a line (offset and drift) fitted to how much later its calls end than the
reference rank's, outliers dropped, then applied to its calls and communication before the
waits are measured. The residual is what the fit leaves: how far apart matched ends still are.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.attribution import merge_intervals
from traceview.analysis.collectives import RUN_PREFIX
from traceview.analysis.groups import Groups, assign_groups
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.results import AllToAllRank, CommByGroup, StepCollective

#: Collectives that no rank can leave before every rank of the group arrived (not broadcast,
#: reduce, send/recv or push/pull: a root or a sender may leave first).
SYNCHRONIZING = ("allreduce", "allgather", "reduce_scatter", "alltoall", "barrier")
MIN_CLOCK_CALLS = 3  # fewer matched synchronizing calls with the reference: no estimate
ISSUED = "issued"  # when the program issued the call (issued_ns, else start_ns)
_KEY = ("group_key", S.NAME, S.COLLECTIVE, "step_key", "position")
_VIEW = ("group_key", S.NAME, S.COLLECTIVE)
LAUNCH_RATIO = 4  # a host view this many times shorter than another view of its calls: a launch


def launch_views(df: pl.DataFrame) -> pl.DataFrame:
    """The (name, collective) views that only launch their calls (module docstring)."""
    views = df.group_by(S.NAME, S.COLLECTIVE).agg(
        (pl.col(S.END_NS) - pl.col(S.START_NS)).sum().alias("busy"),
        (pl.col(S.DEVICE) != S.DEVICE_CPU).any().alias("on_device"),
        pl.col(S.NAME).first().str.starts_with(RUN_PREFIX).alias("runs"),
    )
    longest = views.group_by(S.COLLECTIVE).agg(
        pl.col("on_device").any().alias("op_on_device"),
        pl.col("runs").any().alias("op_runs"),
        pl.col("busy").max().alias("longest"),
    )
    views = views.join(longest, on=S.COLLECTIVE)
    # (a worker's run of a call carries when the call was issued: the issuing view launches)
    launch = ~pl.col("on_device") & (
        pl.col("op_on_device")
        | (pl.col("op_runs") & ~pl.col("runs"))
        | (pl.col("busy") * LAUNCH_RATIO <= pl.col("longest"))
    )
    return views.filter(launch).select(S.NAME, S.COLLECTIVE)


@dataclass
class Matched:
    """Matched collective calls: one row per call per rank (``calls``), and what was not."""

    calls: pl.DataFrame  # the calls' columns + position, last_rank, last_arrival_ns, wait_ns,
    #                     transfer_ns, queued_ns, skew_ns, participants, issued; point-to-point
    #                     calls also peer_rank (the peer as a rank of the world)
    unmatched: dict[int, int] = field(default_factory=dict)  # rank -> calls left unmatched
    #: (rank, step) where the rank made a call left unmatched: its wait there is unknown
    unknown_steps: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema={S.RANK: pl.Int32, S.STEP: pl.Int64})
    )
    #: rank -> point-to-point calls that name no peer (left unmatched, not in ``unmatched``)
    no_peer: dict[int, int] = field(default_factory=dict)


#: Point-to-point calls: matched pairwise with their peer, never as a collective of the world.
POINT_TO_POINT = ("send", "recv")


def global_peer(df: pl.DataFrame, groups: Groups | None) -> pl.DataFrame:
    """``df`` with ``_peer``: the call's peer as a rank of the world (the trace states it inside
    the call's group; where the group is not declared, the rank is taken as the world's)."""
    ranks_of = groups.ranks_of if groups else {}
    table = pl.DataFrame(
        [(name, i, r) for name, ranks in ranks_of.items() for i, r in enumerate(ranks)],
        schema={S.GROUP: pl.String, S.PEER: pl.Int32, "_peer": pl.Int32},
        orient="row",
    )
    return df.join(table, on=[S.GROUP, S.PEER], how="left").with_columns(
        pl.coalesce("_peer", pl.col(S.PEER).cast(pl.Int32)).alias("_peer")
    )


def match_pairs(p2p: pl.DataFrame, groups: Groups | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Sends matched with their receives: rank A's k-th send to B in a step is B's k-th receive
    from A in that step. On either side, the time before the peer issued its call is wait (the
    peer is the rank waited for), the rest transfer. Returns the matched calls (the columns of
    ``Matched.calls``) and the calls left without a partner (no peer, or none on the other
    side)."""
    if p2p.height == 0:
        return p2p, p2p
    df = global_peer(p2p, groups)
    no_peer = df.filter(pl.col("_peer").is_null())
    df = df.filter(pl.col("_peer").is_not_null())
    is_send = pl.col(S.COLLECTIVE) == "send"
    df = df.with_columns(
        pl.when(is_send).then(pl.col(S.RANK)).otherwise(pl.col("_peer")).alias("_src"),
        pl.when(is_send).then(pl.col("_peer")).otherwise(pl.col(S.RANK)).alias("_dst"),
    )
    key = ["_src", "_dst", "step_key"]
    df = df.sort(ISSUED, S.START_NS).with_columns(
        pl.int_range(pl.len()).over([*key, S.COLLECTIVE]).alias("position")
    )
    side = [*key, "position", ISSUED]
    sends = df.filter(is_send).select(side).rename({ISSUED: "_send_issued"})
    recvs = (
        df.filter(~is_send)
        .select(*side, S.END_NS)
        .rename({ISSUED: "_recv_issued", S.END_NS: "_recv_end"})
    )
    both = sends.join(recvs, on=[*key, "position"])
    df = df.join(both, on=[*key, "position"], how="left")
    paired = pl.col("_send_issued").is_not_null() & pl.col("_recv_issued").is_not_null()
    unpaired = pl.concat(
        [no_peer.select(S.RANK, S.STEP), df.filter(~paired).select(S.RANK, S.STEP)]
    )
    other_issued = pl.when(is_send).then("_recv_issued").otherwise("_send_issued")
    # a send is done when its receive is: what a send's span lasts beyond that is gloo's
    # thread getting to its completion (queued), not transfer
    done = pl.when(is_send).then(pl.min_horizontal(S.END_NS, "_recv_end")).otherwise(S.END_NS)
    matched = (
        df.filter(paired)
        .with_columns(
            pl.max_horizontal("_send_issued", "_recv_issued").alias("last_arrival_ns"),
            pl.when(other_issued > pl.col(ISSUED))
            .then(pl.col("_peer"))
            .otherwise(pl.col(S.RANK))
            .cast(pl.Int32)
            .alias("last_rank"),
            (pl.min_horizontal(pl.col(S.END_NS), other_issued) - pl.col(ISSUED))
            .clip(lower_bound=0)
            .alias("wait_ns"),
            (done - pl.max_horizontal(pl.col(ISSUED), other_issued))
            .clip(lower_bound=0)
            .alias("transfer_ns"),
            (pl.col("_send_issued") - pl.col("_recv_issued")).abs().alias("skew_ns"),
            pl.lit(2, pl.Int64).alias("participants"),
            pl.col("_peer").alias("peer_rank"),
        )
        .with_columns(
            (pl.col(S.END_NS) - pl.col(ISSUED) - pl.col("wait_ns") - pl.col("transfer_ns"))
            .clip(lower_bound=0)
            .alias("queued_ns")
        )
    )
    return matched, unpaired


def match_collectives(collectives: pa.Table, groups: Groups | None = None) -> Matched:
    """Match every rank's collective calls with the other ranks' (module docstring): inside
    each call's process group where the run declares its groups (``groups``), the calls of a
    rank that is a member of several groups and whose group is not known left unmatched."""
    df = pl.from_arrow(collectives)
    assert isinstance(df, pl.DataFrame)
    if df.height == 0 or df[S.RANK].n_unique() < 2:
        return Matched(pl.DataFrame())
    df = df.join(launch_views(df), on=[S.NAME, S.COLLECTIVE], how="anti")
    declared = pl.DataFrame(
        [(name, len(ranks)) for name, ranks in (groups.ranks_of if groups else {}).items()],
        schema={S.GROUP: pl.String, "_declared": pl.Int64},
        orient="row",
    )
    df = df.with_columns(
        pl.col(S.GROUP).fill_null("").alias("group_key"),
        pl.col(S.STEP).fill_null(-1).alias("step_key"),
        pl.min_horizontal(pl.coalesce(S.ISSUED_NS, S.START_NS), S.START_NS).alias(ISSUED),
    )
    point = pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT)
    lost = (
        df.filter(point & pl.col(S.PEER).is_null())
        .group_by(S.RANK)
        .agg(pl.len().alias("n"))
        .sort(S.RANK)
    )
    pairs, unpaired = match_pairs(df.filter(point), groups)
    df = df.filter(~point)
    several = groups.several if groups else []
    unknown_group = pl.col(S.GROUP).is_null() & pl.col(S.RANK).is_in(several)
    ambiguous = df.filter(unknown_group)
    df = df.filter(~unknown_group).join(declared, on=S.GROUP, how="left")
    df = df.sort(S.START_NS).with_columns(
        pl.int_range(pl.len()).over([S.RANK, *_VIEW, "step_key"]).alias("position")
    )
    # a declared group's members take part; elsewhere, every rank that makes calls of the view
    participants = df.group_by(_VIEW).agg(pl.col(S.RANK).n_unique().alias("_seen"))
    df = (
        df.join(participants, on=list(_VIEW))
        .with_columns(pl.coalesce("_declared", "_seen").alias("participants"))
        .drop("_declared", "_seen")
    )
    per_key = df.group_by(_KEY).agg(
        pl.col(S.RANK).n_unique().alias("present"),
        pl.len().alias("rows"),
        pl.col(ISSUED).max().alias("last_arrival_ns"),
        pl.col(ISSUED).min().alias("first_arrival_ns"),
        pl.col(S.RANK).sort_by(ISSUED, S.START_NS, S.RANK).last().alias("last_rank"),
    )
    df = df.join(per_key, on=list(_KEY))
    complete = (
        (pl.col("present") == pl.col("participants"))
        & (pl.col("rows") == pl.col("present"))
        & (pl.col("participants") > 1)
    )
    left = pl.concat(
        [
            df.filter(~complete).select(S.RANK, S.STEP),
            ambiguous.select(S.RANK, S.STEP),
            unpaired.select(S.RANK, S.STEP),
        ]
    )
    unmatched = (
        left.group_by(S.RANK)
        .agg(pl.len().alias("n"))
        .join(lost.rename({"n": "_lost"}), on=S.RANK, how="left")
        .select(S.RANK, pl.col("n") - pl.col("_lost").fill_null(0))
        .filter(pl.col("n") > 0)
        .sort(S.RANK)
    )
    unknown = left.select(pl.col(S.RANK).cast(pl.Int32), pl.col(S.STEP).cast(pl.Int64)).unique()
    calls = (
        df.filter(complete)
        .with_columns(
            # from when the program issued the call until the last member issued it: waiting;
            # after that, until its own worker thread began it: queued; the rest: transfer
            (pl.min_horizontal(pl.col(S.END_NS), pl.col("last_arrival_ns")) - pl.col(ISSUED))
            .clip(lower_bound=0)
            .alias("wait_ns"),
            (
                pl.min_horizontal(pl.col(S.START_NS), pl.col(S.END_NS))
                - pl.max_horizontal(pl.col(ISSUED), pl.col("last_arrival_ns"))
            )
            .clip(lower_bound=0)
            .alias("queued_ns"),
            (pl.col("last_arrival_ns") - pl.col("first_arrival_ns"))
            .clip(lower_bound=0)
            .alias("skew_ns"),
        )
        .with_columns(
            (pl.col(S.END_NS) - pl.col(ISSUED) - pl.col("wait_ns") - pl.col("queued_ns"))
            .clip(lower_bound=0)
            .alias("transfer_ns")
        )
        .drop("present", "rows", "first_arrival_ns")
    )
    if pairs.height:
        calls = pl.concat(
            [calls, pairs.select(*calls.columns, "peer_rank")], how="diagonal_relaxed"
        )
    return Matched(
        calls,
        dict(zip(unmatched[S.RANK].to_list(), unmatched["n"].to_list(), strict=True)),
        unknown,
        dict(zip(lost[S.RANK].to_list(), lost["n"].to_list(), strict=True)),
    )


def _covered(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Length of the sorted, disjoint [starts, ends) that lies before each instant of ``at``."""
    if len(starts) == 0:
        return np.zeros(len(at), np.int64)
    before = np.concatenate([[0], np.cumsum(ends - starts)])
    pos = np.searchsorted(starts, at, side="right") - 1
    safe = np.maximum(pos, 0)
    partial = np.clip(at - starts[safe], 0, (ends - starts)[safe])
    return np.where(pos >= 0, before[safe] + partial, 0)


class _Slots:
    """One time line for all ranks: each rank's times shifted into a slot of its own, so one
    sort and one running maximum handle every rank's intervals at once."""

    def __init__(self, *frames: pl.DataFrame) -> None:
        self.origin = min(int(f[S.START_NS].min()) for f in frames)  # type: ignore[arg-type]
        self.span = max(int(f[S.END_NS].max()) for f in frames) - self.origin + 1  # type: ignore[arg-type]
        self.ranks = np.unique(np.concatenate([f[S.RANK].to_numpy() for f in frames])).astype(
            np.int64
        )  # slot i holds rank ranks[i]

    def times(self, df: pl.DataFrame, column: str) -> np.ndarray:
        base = np.searchsorted(self.ranks, df[S.RANK].to_numpy()).astype(np.int64) * self.span
        return df[column].to_numpy().astype(np.int64) - self.origin + base


_NO_WAITS = {S.RANK: pl.Int32, S.STEP: pl.Int64, "wait_ns": pl.Int64, "wait_total_ns": pl.Int64}


def split_waits(matched: Matched, comm: pa.Table) -> pl.DataFrame:
    """Lay the matched calls' waits over each rank's communication (``comm``): per (rank, step),
    ``wait_ns`` (the union of the rank's waits within its exposed communication) and
    ``wait_total_ns`` (within all of it); steps without wait are absent (0)."""
    comm_df = pl.from_arrow(comm)
    assert isinstance(comm_df, pl.DataFrame)
    calls = matched.calls
    if calls.height == 0 or comm_df.height == 0:
        return pl.DataFrame(schema=_NO_WAITS)
    waits = calls.select(
        S.RANK,
        pl.col(ISSUED).alias(S.START_NS),
        (pl.col(ISSUED) + pl.col("wait_ns")).alias(S.END_NS),
    )
    slots = _Slots(waits, comm_df)
    call_start, call_wait_end = slots.times(waits, S.START_NS), slots.times(waits, S.END_NS)
    has_wait = call_wait_end > call_start
    ws, we = merge_intervals(call_start[has_wait], call_wait_end[has_wait])
    cs, ce = slots.times(comm_df, S.START_NS), slots.times(comm_df, S.END_NS)
    pieces = comm_df.select(S.RANK, S.STEP, S.EXPOSED).with_columns(
        pl.Series("overlap", _covered(ws, we, ce) - _covered(ws, we, cs), pl.Int64)
    )
    return pieces.group_by(S.RANK, S.STEP).agg(
        pl.col("overlap").filter(pl.col(S.EXPOSED)).sum().alias("wait_ns"),
        pl.col("overlap").sum().alias("wait_total_ns"),
    )


@dataclass
class Arrivals:
    """Per rank: the wait it caused, i.e. the other ranks' wait inside the matched calls it
    arrived last to (exposed: only what was not hidden behind compute), and how often it was
    last where anyone waited (in the view where that happened most)."""

    caused_ns: dict[int, int]
    caused_exposed_ns: dict[int, int]
    last: dict[int, int]


PAIR = 1 << 32  # (waiting rank, rank waited for) packed into one key


def merged_exposed(keyed: pl.DataFrame, key: str, comm: pa.Table) -> pl.DataFrame:
    """Intervals per (rank, ``key``), ``keyed`` packing both into its rank column (rank *
    ``PAIR`` + key): merged per (rank, key), each with the length of the rank's exposed
    communication (``comm``) it covers (``exposed``)."""
    by_slot = _Slots(keyed)
    ms, me = merge_intervals(by_slot.times(keyed, S.START_NS), by_slot.times(keyed, S.END_NS))
    ident_of_slot = by_slot.ranks
    slot = ms // by_slot.span
    ident = ident_of_slot[slot]
    shift = slot * by_slot.span - by_slot.origin
    merged = pl.DataFrame(
        {
            S.RANK: (ident // PAIR).astype(np.int32),
            key: ident % PAIR,
            S.START_NS: ms - shift,
            S.END_NS: me - shift,
        }
    )
    exposed_ns = np.zeros(merged.height, np.int64)
    comm_df = pl.from_arrow(comm)
    assert isinstance(comm_df, pl.DataFrame)
    exposed = comm_df.filter(pl.col(S.EXPOSED))
    if exposed.height:
        by_rank = _Slots(merged, exposed)
        es, ee = merge_intervals(
            by_rank.times(exposed, S.START_NS), by_rank.times(exposed, S.END_NS)
        )
        exposed_ns = _covered(es, ee, by_rank.times(merged, S.END_NS)) - _covered(
            es, ee, by_rank.times(merged, S.START_NS)
        )
    return merged.with_columns(pl.Series("exposed", exposed_ns, pl.Int64))


def arrivals(matched: Matched, comm: pa.Table) -> Arrivals:
    """Who caused the waiting. A rank's waits in calls with the same last rank are merged before
    they are measured, so a call seen in two views (the training thread's c10d call and gloo's
    thread) or concurrent calls (DDP buckets) count their common time once."""
    calls = matched.calls
    if calls.height == 0:
        return Arrivals({}, {}, {})
    waited = calls.filter(pl.col("skew_ns") > 0)
    per_view = waited.group_by("last_rank", *_VIEW).agg(pl.struct(_KEY).n_unique().alias("n"))
    last_df = per_view.group_by("last_rank").agg(pl.col("n").max())
    last = dict(zip(last_df["last_rank"].to_list(), last_df["n"].to_list(), strict=True))
    waits = waited.filter((pl.col("wait_ns") > 0) & (pl.col(S.RANK) != pl.col("last_rank")))
    if waits.height == 0:
        return Arrivals({}, {}, last)
    # one slot per (waiting rank, rank waited for): merge there, then measure each merged wait
    # against the waiting rank's exposed communication, laid out in slots of its own
    pairs = waits.select(
        (pl.col(S.RANK).cast(pl.Int64) * PAIR + pl.col("last_rank")).alias(S.RANK),
        pl.col(ISSUED).alias(S.START_NS),
        (pl.col(ISSUED) + pl.col("wait_ns")).alias(S.END_NS),
    )
    merged = merged_exposed(pairs, "last_rank", comm)
    caused = (
        merged.with_columns((pl.col(S.END_NS) - pl.col(S.START_NS)).alias("caused"))
        .group_by("last_rank")
        .agg(pl.col("caused", "exposed").sum())
    )
    ranks = caused["last_rank"].to_list()
    return Arrivals(
        dict(zip(ranks, caused["caused"].to_list(), strict=True)),
        dict(zip(ranks, caused["exposed"].to_list(), strict=True)),
        last,
    )


#: NCCL's algorithm and protocol, as its kernel names spell them (ncclKernel_AllReduce_RING_LL_...,
#: ncclDevKernel_AllReduce_Sum_f32_TREE_LL128)
_ALGORITHM = (
    r"_((?:RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(?:LL128|LL|SIMPLE))"
    r"(?:_|\(|$)"
)

#: Bus bandwidth: what each link carries against the message, as nccl-tests defines it, for a
#: group of n ranks.
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_bandwidth_gbps(op: str, ranks: int, size: int | None, transfer_ns: float) -> float | None:
    """Gb/s each link moved during the transfer (not the wait), where the size is known."""
    factor = BUS_FACTOR.get(op)
    if factor is None or not size or transfer_ns <= 0 or ranks < 2:
        return None
    return size * 8 / transfer_ns * factor(ranks)  # bits per ns = Gb/s


def collective_rows(matched: Matched, n_steps: int) -> pl.DataFrame:
    """One row per view and position in the step, over its matched calls: means over calls and
    ranks of wait and transfer, the arrival skew, the rank most often last, and the algorithm
    where the view's name says it (NCCL kernels)."""
    if matched.calls.height == 0:
        return pl.DataFrame()
    steps = max(n_steps, 1)
    key = ["group_key", S.NAME, S.COLLECTIVE, "position", "_direction"]
    calls = matched.calls
    if "peer_rank" not in calls.columns:
        calls = calls.with_columns(pl.lit(None, pl.Int32).alias("peer_rank"))
    # point-to-point calls: one row per direction (the peer's offset), never pooled with calls
    # to other peers as if of one group
    calls = calls.with_columns(
        (pl.col("peer_rank").cast(pl.Int64) - pl.col(S.RANK)).fill_null(0).alias("_direction")
    )
    return (
        calls.group_by(key)
        .agg(
            pl.col("step_key").n_unique().alias("matches"),
            pl.col(S.GROUP).first(),
            pl.col(S.BYTES).max(),
            pl.col("transfer_ns").mean(),
            pl.col("wait_ns").mean(),
            pl.col("queued_ns").mean(),
            pl.col("skew_ns").mean(),
            pl.col("last_rank").mode().min(),  # a tie: the lowest rank
            pl.col(S.RANK).n_unique().alias("_ranks"),
            pl.col("peer_rank").is_not_null().any().alias("_pair"),
        )
        .with_columns(
            pl.when("_pair").then(2).otherwise("_ranks").alias("ranks"),
            (pl.col("matches") / steps).alias("calls_per_step"),
            pl.col(S.NAME).str.extract(_ALGORITHM, 1).alias("algorithm"),
        )
        .sort("position", S.NAME)
    )


_MATCH_COLUMNS = {
    "matched": pl.Boolean,
    "position": pl.Int64,
    "last_rank": pl.Int32,
    "arrival_ns": pl.Int64,
    "last_arrival_ns": pl.Int64,
    "wait_ns": pl.Int64,
    "transfer_ns": pl.Int64,
    "queued_ns": pl.Int64,
    "skew_ns": pl.Int64,
}


def matched_table(collectives: pa.Table, cross: CrossRank | None) -> pa.Table:
    """The collectives table with what matching found for each call (``export``): matched,
    its place in the step, the last rank to arrive, arrival times on the aligned clock, wait,
    transfer and skew; null where the call was left unmatched or is a launch view."""
    if cross is not None and cross.calls is not None:
        collectives = cross.calls  # with the groups the pass told
    df = pl.from_arrow(collectives)
    assert isinstance(df, pl.DataFrame)
    key = [S.RANK, S.NAME, S.COLLECTIVE, S.SEQ]
    calls = cross.matched.calls if cross is not None else pl.DataFrame()
    if calls.height == 0:
        found = pl.DataFrame(schema={**{k: df.schema[k] for k in key}, **_MATCH_COLUMNS})
    else:
        found = calls.select(
            *key,
            pl.lit(True).alias("matched"),
            "position",
            pl.col("last_rank").cast(pl.Int32),
            pl.col(ISSUED).alias("arrival_ns"),
            "last_arrival_ns",
            "wait_ns",
            "transfer_ns",
            "queued_ns",
            "skew_ns",
        ).cast(_MATCH_COLUMNS)  # type: ignore[arg-type]
    joined = df.join(found, on=key, how="left").with_columns(pl.col("matched").fill_null(False))
    return joined.to_arrow()


def step_collectives(table: pa.Table) -> dict[int | None, list[StepCollective]]:
    """Per step, its matched calls (``matched_table``'s rows), the most skewed first."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    df = df.filter(pl.col("matched"))
    if df.height == 0:
        return {}
    key = [S.STEP, S.NAME, S.COLLECTIVE, "position"]
    calls = (
        df.group_by(key)
        .agg(
            pl.col("skew_ns").first(),
            pl.col("last_rank").first(),
            pl.col(S.RANK),
            pl.col("arrival_ns"),
        )
        .sort([S.STEP, "skew_ns", "position", S.NAME], descending=[False, True, False, False])
    )
    out: dict[int | None, list[StepCollective]] = {}
    for row in calls.iter_rows(named=True):
        out.setdefault(row[S.STEP], []).append(
            StepCollective(
                name=row[S.NAME],
                collective=row[S.COLLECTIVE],
                position=row["position"],
                skew_ns=row["skew_ns"],
                last_rank=row["last_rank"],
                arrivals=dict(zip(row[S.RANK], row["arrival_ns"], strict=True)),
            )
        )
    return out


@dataclass
class CrossRank:
    """Everything the cross-rank pass finds, for the summary to turn into results."""

    matched: Matched
    waits: pl.DataFrame  # per (rank, step): wait_ns, wait_total_ns (split_waits)
    arrivals: Arrivals
    clocks: ClockFit | None = None  # where the ranks' clocks were estimated and applied
    groups: Groups = field(default_factory=Groups)  # the process groups the ranks declare
    calls: pa.Table | None = None  # the collectives with the groups told (assign_groups)
    ungrouped: int = 0  # calls whose group could not be told in a run of several groups
    comm: pa.Table | None = None  # the ranks' communication, on the aligned clock

    @property
    def available(self) -> bool:
        return self.matched.calls.height > 0


@dataclass
class ClockFit:
    """Per rank, how its clock reads against the reference rank's: at reference time T it reads
    ``T + offset_ns + drift * (T - t0_ns)``. Ranks absent were not estimated."""

    reference: int
    t0_ns: int
    offset_ns: dict[int, float]
    drift: dict[int, float]  # ns per ns (1e-6: 1 ppm)
    calls: int  # matched synchronizing calls the fit used
    residual_ns: float  # p90 of how far a rank's ends lie from the reference's, once aligned
    unaligned: list[int] = field(default_factory=list)  # ranks with too few calls to fit

    def shifted_segments(self, segments: TableOnDemand) -> TableOnDemand:
        """A run's segments (read a piece at a time) on the reference clock."""

        def shift(table: pa.Table) -> pa.Table:
            frame = pl.from_arrow(table)
            assert isinstance(frame, pl.DataFrame)
            return self.shift(frame, S.START_NS, S.END_NS).to_arrow()

        return segments.mapped(shift)

    def shift(self, df: pl.DataFrame, *columns: str) -> pl.DataFrame:
        """``df``'s time ``columns`` moved onto the reference clock."""
        lines = pl.DataFrame(
            {
                S.RANK: list(self.offset_ns),
                "_offset": list(self.offset_ns.values()),
                "_drift": [self.drift[r] for r in self.offset_ns],
            },
            schema={S.RANK: df.schema[S.RANK], "_offset": pl.Float64, "_drift": pl.Float64},
        )
        df = df.join(lines, on=S.RANK, how="left").with_columns(
            pl.col("_offset", "_drift").fill_null(0.0)
        )
        # T = t0 + (t - t0 - offset) / (1 + drift), with t - t0 exact in integers first
        return df.with_columns(
            (
                pl.lit(self.t0_ns, pl.Int64)
                + (
                    ((pl.col(c) - self.t0_ns).cast(pl.Float64) - pl.col("_offset"))
                    / (1.0 + pl.col("_drift"))
                ).round()
            )
            .cast(pl.Int64)
            .alias(c)
            for c in columns
        ).drop("_offset", "_drift")


MIN_DRIFT_SPAN_NS = 10_000_000_000  # a drift is fitted only over calls this far apart (10 s)
MAX_DRIFT = 1e-3  # 1000 ppm: no working clock drifts faster; a steeper fit is noise


def _collective_edges(calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Offsets between ranks from the matched synchronizing ``calls``: each rank against the
    lowest rank of every call it took part in (its group's), one line per such pair (``edges``:
    a, b, offset at ``t0``, drift, error, calls), the points' residuals, and ``t0`` (the first
    call's end)."""
    edge_schema = {"a": pl.Int64, "b": pl.Int64, "offset": pl.Float64, "drift": pl.Float64,
                   "error": pl.Float64, "calls": pl.Int64}  # fmt: skip
    calls = calls.filter(pl.col(S.COLLECTIVE).is_in(SYNCHRONIZING))
    if calls.height == 0:
        return pl.DataFrame(schema=edge_schema), pl.DataFrame(), 0
    calls = calls.with_columns(pl.col(S.RANK).cast(pl.Int64).min().over(_KEY).alias("a"))
    ref = calls.filter(pl.col(S.RANK) == pl.col("a")).select(
        *_KEY, pl.col(S.START_NS).alias("ref_start"), pl.col(S.END_NS).alias("ref_end")
    )
    t0 = int(ref["ref_end"].min()) if ref.height else 0  # type: ignore[arg-type]
    points = (
        calls.filter(pl.col(S.RANK) != pl.col("a"))
        .join(ref, on=list(_KEY))
        .select(
            (pl.col("a") * PAIR + pl.col(S.RANK)).alias("_edge"),
            (pl.col("ref_end") - t0).cast(pl.Float64).alias("x"),
            (pl.col(S.END_NS) - pl.col("ref_end")).cast(pl.Float64).alias("y"),
            # the offsets the call allows: [lo, hi]
            (pl.col(S.START_NS) - pl.col("ref_end")).cast(pl.Float64).alias("lo"),
            (pl.col(S.END_NS) - pl.col("ref_start")).cast(pl.Float64).alias("hi"),
        )
    )
    if points.height == 0:
        return pl.DataFrame(schema=edge_schema), points, t0
    # drift: slope between the halves' medians, where the span and the effect are large enough
    half = pl.col("x") >= pl.col("x").median().over("_edge")
    halves = points.group_by("_edge").agg(
        (pl.col("x").max() - pl.col("x").min()).alias("span"),
        pl.col("x").filter(~half).median().alias("x1"),
        pl.col("x").filter(half).median().alias("x2"),
        pl.col("y").filter(~half).median().alias("y1"),
        pl.col("y").filter(half).median().alias("y2"),
        (pl.col("y") - pl.col("y").median()).abs().median().alias("spread"),
    )
    slope = (pl.col("y2") - pl.col("y1")) / (pl.col("x2") - pl.col("x1"))
    drift_ok = (
        (pl.col("span") >= MIN_DRIFT_SPAN_NS)
        & (pl.col("x2") > pl.col("x1"))
        & (slope.abs() <= MAX_DRIFT)
        & (slope.abs() * pl.col("span") > 3 * pl.col("spread"))
    )
    lines = halves.select("_edge", pl.when(drift_ok).then(slope).otherwise(0.0).alias("b"))
    points = points.join(lines, on="_edge").with_columns(
        (pl.col(c) - pl.col("b") * pl.col("x")).alias(c) for c in ("y", "lo", "hi")
    )
    fit = (
        points.group_by("_edge")
        .agg(
            pl.col("b").first(),
            pl.col("y").median().alias("a"),
            pl.col("lo").max().alias("low"),
            pl.col("hi").min().alias("high"),
            pl.len().alias("n"),
            (pl.col("y") - pl.col("y").median()).abs().median().alias("mad"),
            pl.col("y").std().fill_null(0.0).alias("sd"),
        )
        .with_columns(
            pl.when(pl.col("low") <= pl.col("high"))
            .then(pl.col("a").clip(pl.col("low"), pl.col("high")))
            .otherwise(pl.col("a"))
            .alias("a"),
            # the median's standard error from the spread of the ends, the larger of two
            # readings of it (1.4826 MAD ~ sigma; the standard deviation): in doubt, no shift
            (
                1.25 * pl.max_horizontal(1.4826 * pl.col("mad"), pl.col("sd")) / pl.col("n").sqrt()
            ).alias("error"),
        )
        .with_columns(
            # an offset within two standard errors of 0 is noise: the clocks agree
            pl.when((pl.col("a").abs() <= 2 * pl.col("error")) & (pl.col("b") == 0))
            .then(0.0)
            .otherwise(pl.col("a"))
            .alias("a")
        )
        .filter(pl.col("n") >= MIN_CLOCK_CALLS)
    )
    fitted = points.join(fit.select("_edge", pl.col("a").alias("_a")), on="_edge").select(
        (pl.col("y") - pl.col("_a")).abs().alias("residual")
    )
    edges = fit.select(
        (pl.col("_edge") // PAIR).alias("a"),
        (pl.col("_edge") % PAIR).alias("b"),
        pl.col("a").alias("offset"),
        pl.col("b").alias("drift"),
        "error",
        pl.col("n").cast(pl.Int64).alias("calls"),
    )
    return edges.cast(edge_schema), fitted, t0  # type: ignore[arg-type]


def _pair_edges(calls: pl.DataFrame) -> pl.DataFrame:
    """Offsets between ranks from matched point-to-point pairs (``calls`` with ``peer_rank``).
    A receive cannot end before its send was issued: a message from a to b bounds b's clock
    against a's from above (b's receive end less a's issue), one from b to a from below. Where
    the pair of ranks sent both ways, the offset is the middle of the tightest bounds (0 where
    they allow 0: not shown to differ), its error half their distance: within a transfer where a
    receive in each direction was already waiting when the message was sent (a pipeline's
    stages wait for each other's activations and gradients)."""
    schema = {"a": pl.Int64, "b": pl.Int64, "offset": pl.Float64, "drift": pl.Float64,
              "error": pl.Float64, "calls": pl.Int64}  # fmt: skip
    if "peer_rank" not in calls.columns:
        return pl.DataFrame(schema=schema)
    p2p = calls.filter(pl.col("peer_rank").is_not_null())
    if p2p.height == 0:
        return pl.DataFrame(schema=schema)
    key = ["_src", "_dst", "step_key", "position"]
    sends = p2p.filter(pl.col(S.COLLECTIVE) == "send").select(
        pl.col(S.RANK).cast(pl.Int64).alias("_src"),
        pl.col("peer_rank").cast(pl.Int64).alias("_dst"),
        "step_key",
        "position",
        pl.col(ISSUED).alias("_sent"),
    )
    recvs = p2p.filter(pl.col(S.COLLECTIVE) == "recv").select(
        pl.col("peer_rank").cast(pl.Int64).alias("_src"),
        pl.col(S.RANK).cast(pl.Int64).alias("_dst"),
        "step_key",
        "position",
        pl.col(S.END_NS).alias("_received"),
    )
    bound = (pl.col("_received") - pl.col("_sent")).cast(pl.Float64)
    forward = pl.col("_src") < pl.col("_dst")
    edges = (
        sends.join(recvs, on=key)
        .filter(pl.col("_src") != pl.col("_dst"))
        .group_by(
            pl.min_horizontal("_src", "_dst").alias("a"),
            pl.max_horizontal("_src", "_dst").alias("b"),
        )
        .agg(
            bound.filter(forward).min().alias("high"),
            (-bound).filter(~forward).max().alias("low"),
            pl.len().alias("calls"),
        )
        .filter(pl.col("high").is_not_null() & pl.col("low").is_not_null())
        .with_columns(((pl.col("high") + pl.col("low")) / 2).alias("offset"))
        .select(
            "a",
            "b",
            pl.when((pl.col("low") <= 0) & (pl.col("high") >= 0))
            .then(0.0)
            .otherwise("offset")
            .alias("offset"),
            pl.lit(0.0).alias("drift"),
            ((pl.col("high") - pl.col("low")).abs() / 2).alias("error"),
            pl.col("calls").cast(pl.Int64),
        )
    )
    return edges.cast(schema)  # type: ignore[arg-type]


def _chain(edges: pl.DataFrame, reference: int) -> dict[int, tuple[float, float]]:
    """Each rank's (offset, drift) against ``reference`` along the surest path of ``edges``
    (each: b's clock less a's), the sum of the edges' errors smallest; ranks no path reaches
    are absent. One entry per pair of ranks, not per call: a Python walk is cheap."""
    graph: dict[int, list[tuple[int, float, float, float]]] = {}
    for a, b, offset, drift, error in edges.select(
        "a", "b", "offset", "drift", "error"
    ).iter_rows():
        cost = float(error) + 1.0  # (1 ns a hop: fewer hops where errors tie)
        graph.setdefault(a, []).append((b, offset, drift, cost))
        graph.setdefault(b, []).append((a, -offset, -drift, cost))
    found: dict[int, tuple[float, float]] = {}
    queue = [(0.0, reference, 0.0, 0.0)]
    while queue:
        cost, rank, offset, drift = heapq.heappop(queue)
        if rank in found:
            continue
        found[rank] = (offset, drift)
        for other, edge_offset, edge_drift, edge_cost in graph.get(rank, []):
            if other not in found:
                heapq.heappush(
                    queue, (cost + edge_cost, other, offset + edge_offset, drift + edge_drift)
                )
    return found


def estimate_clocks(matched: Matched) -> ClockFit | None:
    """Each rank's clock against the lowest rank's, from the matched synchronizing calls and
    point-to-point pairs (module docstring); None where there are none.

    Synchronizing calls: each rank against the lowest rank of each call it took part in (its
    group's). The offset is the median of how much later the rank's calls end than that rank's
    (all ranks leave a synchronizing call within a transfer of each other; a median ignores the
    calls one of them left late, descheduled). A drift is fitted only where the calls span
    ``MIN_DRIFT_SPAN_NS`` and it moves the line by more than the residual over that span (on a
    short profile it is indistinguishable from noise), as the slope between the medians of the
    two halves of the calls. The offset is then held inside what the calls allow: no rank can
    leave a call before the other arrived, nor the other before the rank arrived. An offset
    within two standard errors of zero (ends spread widely, few calls) is taken as zero: the
    clocks are not shown to differ, and shifting them by noise would only add error.

    Point-to-point pairs (``_pair_edges``) link ranks that share no synchronizing call: the
    stages of a pipeline across hosts. Each rank's clock is then the sum of the offsets along
    the surest chain of such links from the reference (``_chain``): ranks of a mesh that share
    no group with the lowest rank are reached through the groups they share with others.
    """
    calls = matched.calls
    if calls.height == 0:
        return None
    collective_edges, fitted, t0 = _collective_edges(calls)
    edges = pl.concat([collective_edges, _pair_edges(calls)])
    involved = calls.filter(
        pl.col(S.COLLECTIVE).is_in([*SYNCHRONIZING, *POINT_TO_POINT])
    ).get_column(S.RANK)
    if involved.len() == 0:
        return None
    reference = int(involved.min())  # type: ignore[arg-type]
    if edges.height == 0:
        return None
    chained = _chain(edges, reference)
    if len(chained) < 2:
        return None
    if fitted.height:
        residual = float(fitted["residual"].quantile(0.9) or 0.0)
    else:  # pairs only: half the distance of their bounds
        residual = float(edges["error"].max() or 0.0)  # type: ignore[arg-type]
    ranks = sorted(chained)
    return ClockFit(
        reference=reference,
        t0_ns=t0,
        offset_ns={r: chained[r][0] for r in ranks},
        drift={r: chained[r][1] for r in ranks},
        calls=int(edges["calls"].sum()),
        residual_ns=residual,
        unaligned=sorted(set(involved.unique().to_list()) - set(chained)),
    )


def cross_rank(
    collectives: pa.Table,
    comm: pa.Table,
    *,
    align_clocks: bool = False,
    groups: Groups | None = None,
) -> CrossRank:
    """Match, split and attribute; ``align_clocks``: the ranks' clocks may differ (traces from
    several hosts that ``collect`` did not align), so estimate them first; ``groups``: the
    process groups the ranks declare (each call is matched inside its own)."""
    groups = groups or Groups()
    collectives, ungrouped = assign_groups(collectives, groups)
    matched = match_collectives(collectives, groups)
    clocks = estimate_clocks(matched) if align_clocks else None
    if clocks is not None:
        shifted = clocks.shift(pl.from_arrow(collectives), S.START_NS, S.END_NS, S.ISSUED_NS)  # type: ignore[arg-type]
        matched = match_collectives(shifted.to_arrow(), groups)
        comm = clocks.shift(pl.from_arrow(comm), S.START_NS, S.END_NS).to_arrow()  # type: ignore[arg-type]
    return CrossRank(
        matched,
        split_waits(matched, comm),
        arrivals(matched, comm),
        clocks,
        groups,
        collectives,
        ungrouped,
        comm,
    )


def comm_by_group(
    matched: Matched, comm: pa.Table, groups: Groups, n_steps: int
) -> list[CommByGroup]:
    """Per (group, issuing phase, collective): the matched calls' time from issue to end (each
    rank's overlapping calls merged), the part of it exposed on the rank (``comm``'s exposed
    pieces), their wait and transfer, as means per step over the ranks that make the calls."""
    calls = matched.calls
    if calls.height == 0:
        return []
    steps = max(n_steps, 1)
    key = [S.GROUP, S.ISSUED_IN, S.COLLECTIVE]
    calls = calls.with_columns(
        pl.col(S.ISSUED_IN).fill_null(S.OTHER), pl.col(S.GROUP).fill_null("")
    ).with_columns(pl.struct(key).rank("dense").cast(pl.Int64).alias("_key"))
    # one slot per (rank, key): merge there, then measure each merged interval's exposed part
    slotted = calls.select(
        (pl.col(S.RANK).cast(pl.Int64) * PAIR + pl.col("_key")).alias(S.RANK),
        pl.col(ISSUED).alias(S.START_NS),
        S.END_NS,
    )
    merged = merged_exposed(slotted, "_key", comm)
    spans = (
        merged.with_columns(
            (pl.col(S.END_NS) - pl.col(S.START_NS)).alias("_total"),
            pl.col("exposed").alias("_exposed"),
        )
        .group_by("_key")
        .agg(pl.col("_total").sum(), pl.col("_exposed").sum())
    )
    rows = (
        calls.group_by("_key", *key)
        .agg(
            pl.len().alias("_calls"),
            pl.col(S.RANK).n_unique().alias("_ranks"),
            pl.col(S.BYTES).sum().alias("_bytes"),
            pl.col(S.BYTES).is_null().any().alias("_unsized"),
            pl.col("wait_ns").sum().alias("_wait"),
            pl.col("queued_ns").sum().alias("_queued"),
            pl.col("transfer_ns").sum().alias("_transfer"),
        )
        .join(spans, on="_key", how="left")
        .sort(S.GROUP, S.ISSUED_IN, S.COLLECTIVE)
    )
    ranks_of = groups.ranks_of
    dims = {g.name: g.dim for g in groups.groups}
    out = []
    for row in rows.iter_rows(named=True):
        per = steps * row["_ranks"]
        total = (row["_total"] or 0) / per / 1e6
        exposed_ms = min((row["_exposed"] or 0) / per / 1e6, total)
        # wait, queue and transfer are summed over calls that can overlap (a sum at least the
        # merged total): scaled to it
        parts = [row[c] / per / 1e6 for c in ("_wait", "_queued", "_transfer")]
        scale = total / sum(parts) if sum(parts) > 0 else 0.0
        wait, queued, transfer = (part * scale for part in parts)
        name = row[S.GROUP] or None
        out.append(
            CommByGroup(
                group=name,
                dim=dims.get(name) if name else None,
                ranks=ranks_of.get(name) if name else None,
                phase=row[S.ISSUED_IN],
                op=row[S.COLLECTIVE],
                calls_per_step=round(row["_calls"] / per, 3),
                bytes_per_step=None if row["_unsized"] else round(row["_bytes"] / per),
                total_ms=round(total, 3),
                exposed_ms=round(exposed_ms, 3),
                hidden_ms=round(total - exposed_ms, 3),
                wait_ms=round(wait, 3),
                transfer_ms=round(transfer, 3),
                queued_ms=round(queued, 3),
            )
        )
    return out


def alltoall_ranks(matched: Matched, n_steps: int) -> list[AllToAllRank]:
    """Per rank and group, its matched all-to-alls: calls and bytes sent per step, transfer,
    and the split imbalance (``schema.SPLIT_IMBALANCE``) turned into time: a call whose largest
    split is ``i`` times the mean moves for ``transfer`` where an even split would move for
    ``transfer / i``, so it costs ``transfer * (1 - 1 / i)``."""
    calls = matched.calls
    if calls.height == 0 or S.SPLIT_IMBALANCE not in calls.columns:
        return []
    calls = calls.filter(pl.col(S.COLLECTIVE) == "alltoall")
    if calls.height == 0:
        return []
    steps = max(n_steps, 1)
    split = pl.col(S.SPLIT_IMBALANCE)
    rows = (
        calls.group_by(S.RANK, S.GROUP)
        .agg(
            pl.len().alias("_calls"),
            pl.col(S.BYTES).sum().alias("_bytes"),
            pl.col(S.BYTES).is_null().any().alias("_unsized"),
            pl.col("transfer_ns").sum().alias("_transfer"),
            split.mean().alias("_imbalance"),
            (pl.col("transfer_ns") * (1 - 1 / split.clip(lower_bound=1.0)))
            .filter(split.is_not_null())
            .sum()
            .alias("_cost"),
            split.is_not_null().any().alias("_recorded"),
        )
        .sort(S.RANK, S.GROUP, nulls_last=True)
    )
    per = 1e-6 / steps
    return [
        AllToAllRank(
            rank=row[S.RANK],
            group=row[S.GROUP],
            calls_per_step=round(row["_calls"] / steps, 3),
            bytes_per_step=None if row["_unsized"] else round(row["_bytes"] / steps),
            transfer_ms=round(row["_transfer"] * per, 3),
            split_imbalance=round(row["_imbalance"], 3) if row["_recorded"] else None,
            imbalance_ms=round(row["_cost"] * per, 3) if row["_recorded"] else None,
        )
        for row in rows.iter_rows(named=True)
    ]
