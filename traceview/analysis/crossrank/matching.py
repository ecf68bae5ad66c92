"""Matching: each rank's collective calls paired with the other ranks' (``match_collectives``),
sends with their receives (``match_pairs``), and the views that only launch their calls left out
(``launch_views``).

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from traceview.analysis.collectives import RUN_PREFIX
from traceview.analysis.groups import Groups
from traceview.model import schema as S

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


#: The calls a parameter server answers: a worker's of one view in a step are one round.
SERVED = ("push", "pull")


def _rounds(df: pl.DataFrame) -> pl.DataFrame:
    """A worker's pushes and pulls of one view in a step as one call, from its first issue to
    its last end (bytes summed): its engine runs a step's pushes at once, in an order of its
    own, each until the server answers, and a profile nests them by their times, so that the
    outermost calls a rank shows in a step are no count every worker shares (MXNet's
    ``dist_sync`` with the pushes overlapping backward). The round is what every worker waits
    through alike: the last push of the step the server needs from each."""
    served = pl.col(S.COLLECTIVE).is_in(SERVED)
    if not df.select(served.any()).item():
        return df
    keys = [S.RANK, "group_key", S.NAME, S.COLLECTIVE, "step_key"]
    firsts = [c for c in df.columns if c not in {*keys, S.START_NS, S.END_NS, ISSUED, S.BYTES}]
    rounds = (
        df.filter(served)
        .sort(S.START_NS)
        .group_by(keys, maintain_order=True)
        .agg(
            *(pl.col(c).first() for c in firsts),
            pl.col(S.START_NS).min(),
            pl.col(S.END_NS).max(),
            pl.col(ISSUED).min(),
            pl.when(pl.col(S.BYTES).is_not_null().any()).then(pl.col(S.BYTES).sum()),
        )
    )
    return pl.concat([df.filter(~served), rounds.select(df.columns)], how="vertical_relaxed")


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
    df = _rounds(df.filter(~point))
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
