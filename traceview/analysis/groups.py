"""Process groups: which ranks each collective call is made among.

A job's collectives run in process groups: the world, and in jobs beyond data parallelism a
group per mesh dimension (FSDP's data-parallel shards, tensor-parallel pairs, pipeline stages).
A call is matched only with the calls of its own group's members.

Declared groups. PyTorch writes each rank's groups into its trace (``distributedInfo.pg_config``:
name, description, ranks); a DeviceMesh names its groups' descriptions after the mesh's
dimensions (``mesh_tp``), which gives each group its dimension (``tp``). The run's groups are the
union of what its ranks declare; a name that two ranks declare with different ranks, or that
names ranks outside the world, is a warning (the first declaration is kept).

A call's group. NCCL's calls name it (``Process Group Name``). gloo's do not: its worker threads
run the calls (``gloo:all_reduce``), and each process group has threads of its own. Where a rank
is a member of one multi-rank group only, every call is that group's. Otherwise each worker thread
is given the group whose members' calls end together with its calls (a synchronizing collective
ends on all members within a transfer of each other): for each candidate group, the share of the
thread's calls that a call of the same collective on every other member ends within ``END_TOLERANCE``
of. The best candidate wins when it explains most of the calls and clearly more than the next;
otherwise the thread's calls are left without a group, and unmatched (one note counts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.collectives import RUN_PREFIX
from traceview.model import schema as S
from traceview.model.columns import decode_ranks
from traceview.model.errors import BadInput
from traceview.model.escape import safe
from traceview.model.results import ProcessGroup

#: Ends of one synchronizing call on two members within this: the same call.
END_TOLERANCE_NS = 200_000
END_TOLERANCE_SHARE = 0.02  # ... or within this share of the call's duration
#: A thread's group explains at least this share of its calls, this much more than the next.
MIN_SHARE = 0.6
MIN_MARGIN = 0.2
#: Calls of a thread compared (its first ones): enough evidence, bounded cost at many ranks.
MAX_EVIDENCE = 64
_SYNCHRONIZING = ("allreduce", "allgather", "reduce_scatter", "alltoall", "barrier")


def dimension(desc: str | None) -> str | None:
    """A DeviceMesh group's dimension from its description (``mesh_tp`` -> ``tp``)."""
    if desc and desc.startswith("mesh_") and len(desc) > 5:
        return desc[5:]
    return None


@dataclass
class Groups:
    """The run's declared groups, and for each rank the names of those it is a member of."""

    groups: list[ProcessGroup] = field(default_factory=list)
    of_rank: dict[int, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @cached_property
    def ranks_of(self) -> dict[str, list[int]]:
        return {g.name: g.ranks for g in self.groups}

    @cached_property
    def alike(self) -> dict[str, str]:
        """Each group's name -> the first group (in ``groups``' order) with the same ranks:
        groups of the same members are one for matching (DeepSpeed and gloo jobs create several
        groups of the whole world, and nothing in a trace tells their calls apart)."""
        first: dict[tuple[int, ...], str] = {}
        return {g.name: first.setdefault(tuple(g.ranks), g.name) for g in self.groups}

    @cached_property
    def several(self) -> list[int]:
        """Ranks that are members of groups of two ranks or more with different members: a call
        of theirs whose group is not known cannot be matched."""
        alike, ranks_of = self.alike, self.ranks_of
        return [
            rank
            for rank, names in self.of_rank.items()
            if len({alike[n] for n in names if len(ranks_of[n]) > 1}) > 1
        ]


def declared_groups(declared: dict[int, list[dict[str, str]]], world: int | None) -> Groups:
    """The run's groups from each rank's declaration (``read_pg_config``'s entries). Each distinct
    ranks text is decoded once (a job that creates every subgroup on every rank declares each
    of them on every rank: 321 groups x 1,024 ranks on a 3-D mesh)."""
    first: dict[str, tuple[str, str]] = {}  # name -> (desc, ranks text) as first declared
    members: dict[str, frozenset[int]] = {}  # ranks text -> its ranks
    disagree: set[str] = set()
    dissenters: set[int] = set()  # ranks whose declaration of a group differs from the first
    of_rank: dict[int, list[str]] = {}
    previous: list[dict[str, str]] | None = None
    pairs: list[tuple[str, frozenset[int]]] = []  # the declaration's groups, as first declared
    dissent = False
    names_of: dict[int, list[str]] | None = None  # rank -> its groups, for a repeated declaration
    for rank in sorted(declared):
        entries = declared[rank]
        if entries is previous or entries == previous:
            # the same declaration as the rank before (every rank declaring every group): its
            # groups once, and each rank's own from one inverted map
            if names_of is None:
                names_of = {}
                for name, group in pairs:
                    for r in group:
                        names_of.setdefault(r, []).append(name)
            if dissent:
                dissenters.add(rank)
            if rank in names_of:
                of_rank[rank] = names_of[rank]
            continue
        previous, pairs, dissent, names_of = entries, [], False, None
        mine = []
        for entry in entries:
            name, text = entry["name"], entry["ranks"]
            kept = first.get(name)
            if kept is None:
                kept = first[name] = (entry["desc"], text)
            elif kept[1] != text:
                disagree.add(name)
                dissent = True
            ranks = members.get(kept[1])
            if ranks is None:
                try:
                    ranks = members[kept[1]] = frozenset(decode_ranks(kept[1]))
                except ValueError as exc:  # (a manifest written by hand, or damaged)
                    raise BadInput(
                        f"process group {safe(name, 60)}: its ranks in the run's manifest, "
                        f"{safe(kept[1], 60)!r}, do not read ({safe(exc, 80)})"
                    ) from None
            pairs.append((name, ranks))
            if rank in ranks:
                mine.append(name)
        if dissent:
            dissenters.add(rank)
        if mine:
            of_rank[rank] = mine
    found = []
    outside = []
    for name, (desc_text, text) in first.items():
        listed = sorted(members[text])
        if world and listed and listed[-1] >= world:
            outside.append(name)
        desc = desc_text if desc_text not in ("", "undefined") else None
        found.append(ProcessGroup(name=name, desc=desc, dim=dimension(desc), ranks=listed))
    warnings = []
    if disagree:
        warnings.append(
            f"{len(disagree)} process group(s) declared with different ranks by different ranks "
            f"({', '.join(sorted(disagree)[:5])}; {len(dissenters)} rank(s) disagree with the "
            "lowest rank's declaration): the lowest rank's declaration kept"
        )
    if outside:
        warnings.append(
            f"{len(outside)} process group(s) name ranks beyond the world of {world} "
            f"({', '.join(sorted(outside)[:5])}): their calls are left unmatched"
        )
    ordered = sorted(found, key=lambda g: (len(g.name), g.name))
    return Groups(ordered, of_rank, warnings)


def assign_groups(calls: pa.Table, groups: Groups) -> tuple[pa.Table, int]:
    """``calls`` (schema.COLLECTIVES_SCHEMA) with the group of every call the trace does not
    name, where it can be told (module docstring), and how many calls stay without one in a run
    whose ranks are members of several groups."""
    if calls.num_rows == 0 or not groups.groups or calls.column(S.GROUP).null_count == 0:
        return calls, 0  # (NCCL: every call names its group)
    df = pl.from_arrow(calls)
    assert isinstance(df, pl.DataFrame)
    ranks_of = groups.ranks_of
    alike = groups.alike
    # each rank's candidate groups: those of two ranks or more it is a member of, one of each
    # set of members
    candidates = pl.DataFrame(
        sorted(
            {
                (rank, alike[name])
                for rank, names in groups.of_rank.items()
                for name in names
                if len(ranks_of[name]) > 1
            }
        ),
        schema={S.RANK: pl.Int32, "candidate": pl.String},
        orient="row",
    )
    if candidates.height == 0:
        return calls, 0
    df = df.with_row_index("_row")
    unnamed = df.filter(pl.col(S.GROUP).is_null() & (pl.col(S.DEVICE) == S.DEVICE_CPU))
    count = candidates.group_by(S.RANK).agg(pl.len().alias("n"), pl.col("candidate").first())
    sole = count.filter(pl.col("n") == 1).select(S.RANK, pl.col("candidate").alias("_sole"))
    df = df.join(sole, on=S.RANK, how="left").with_columns(
        pl.coalesce(S.GROUP, "_sole").alias(S.GROUP)
    )
    several = unnamed.join(count.filter(pl.col("n") > 1).select(S.RANK), on=S.RANK)
    left = 0
    if several.height:
        by_thread = _thread_groups(several, df, candidates, ranks_of)
        found = several.join(by_thread, on=[S.RANK, S.TID], how="left").select(
            "_row", pl.col("_group")
        )
        df = df.join(found, on="_row", how="left").with_columns(
            pl.coalesce(S.GROUP, "_group").alias(S.GROUP)
        )
        df = _issues_named_by_runs(df)
        left = df.join(several.select("_row"), on="_row").get_column(S.GROUP).null_count()
    out = df.sort("_row").select(calls.column_names).to_arrow()
    return S.conform(out, calls.schema), left


def _issues_named_by_runs(df: pl.DataFrame) -> pl.DataFrame:
    """A host call without a group takes the group of the first worker run of its collective on
    its rank that began after it (the thread that ran it serves one group)."""
    runs = (
        df.filter(pl.col(S.NAME).str.starts_with(RUN_PREFIX) & pl.col(S.GROUP).is_not_null())
        .select(S.RANK, S.COLLECTIVE, pl.col(S.START_NS).alias("_run"), pl.col(S.GROUP).alias("_g"))
        .sort("_run")
    )
    issues = df.filter(
        pl.col(S.GROUP).is_null()
        & (pl.col(S.DEVICE) == S.DEVICE_CPU)
        & ~pl.col(S.NAME).str.starts_with(RUN_PREFIX)
    )
    if runs.height == 0 or issues.height == 0:
        return df
    found = (
        issues.select("_row", S.RANK, S.COLLECTIVE, S.START_NS)
        .sort(S.START_NS)
        .join_asof(
            runs,
            left_on=S.START_NS,
            right_on="_run",
            by=[S.RANK, S.COLLECTIVE],
            strategy="forward",
            check_sortedness=False,
        )
        .select("_row", "_g")
    )
    return (
        df.join(found, on="_row", how="left")
        .with_columns(pl.coalesce(S.GROUP, "_g").alias(S.GROUP))
        .drop("_g")
    )


def _thread_groups(
    unnamed: pl.DataFrame,
    calls: pl.DataFrame,
    candidates: pl.DataFrame,
    ranks_of: dict[str, list[int]],
) -> pl.DataFrame:
    """(rank, tid) -> the group the ends of its calls (``unnamed``) agree with, among all
    ``calls`` (module docstring); threads whose evidence is not clear are absent."""
    sync = unnamed.filter(pl.col(S.COLLECTIVE).is_in(_SYNCHRONIZING))
    if sync.height == 0:
        return pl.DataFrame(schema={S.RANK: pl.Int32, S.TID: pl.Int64, "_group": pl.String})
    evidence = (
        sync.sort(S.START_NS)
        .with_columns(pl.int_range(pl.len()).over(S.RANK, S.TID).alias("_n"))
        .filter(pl.col("_n") < MAX_EVIDENCE)
        .select(
            S.RANK,
            S.TID,
            S.COLLECTIVE,
            S.END_NS,
            pl.max_horizontal(
                pl.lit(END_TOLERANCE_NS),
                ((pl.col(S.END_NS) - pl.col(S.START_NS)) * END_TOLERANCE_SHARE).cast(pl.Int64),
            ).alias("_tol"),
        )
        .with_row_index("_call")
    )
    # each (call, candidate group, other member)
    members = pl.DataFrame(
        [(name, member) for name, ranks in ranks_of.items() for member in ranks],
        schema={"candidate": pl.String, "_member": pl.Int32},
        orient="row",
    )
    probes = (
        evidence.join(candidates, on=S.RANK)
        .join(members, on="candidate")
        .filter(pl.col("_member") != pl.col(S.RANK))
    )
    # a member's calls of that group (or of no known group) that end together with the probe
    all_calls = calls.filter(pl.col(S.COLLECTIVE).is_in(_SYNCHRONIZING))
    ends = all_calls.select(
        pl.col(S.RANK).alias("_member"),
        S.COLLECTIVE,
        pl.col(S.GROUP).alias("candidate"),
        pl.col(S.END_NS).alias("_end"),
    ).sort("_end")
    probes = probes.sort(S.END_NS)
    hits = []
    for known, by in (
        (True, ["_member", S.COLLECTIVE, "candidate"]),
        (False, ["_member", S.COLLECTIVE]),
    ):
        side = ends.filter(pl.col("candidate").is_not_null() == known)
        if not known:
            side = side.drop("candidate")
        hits.append(
            probes.join_asof(
                side,
                left_on=S.END_NS,
                right_on="_end",
                by=by,
                strategy="nearest",
                check_sortedness=False,  # (sorted by time; the groups need not be)
            ).select(
                "_call",
                "candidate",
                "_member",
                ((pl.col("_end") - pl.col(S.END_NS)).abs() <= pl.col("_tol"))
                .fill_null(False)
                .alias("_hit"),
            )
        )
    nearest = (
        probes.select("_call", S.RANK, S.TID, "candidate", "_member")
        .join(hits[0].rename({"_hit": "_known"}), on=["_call", "candidate", "_member"])
        .join(hits[1].rename({"_hit": "_unknown"}), on=["_call", "candidate", "_member"])
    )
    per_call = nearest.group_by("_call", S.RANK, S.TID, "candidate").agg(
        pl.col("_known").all().alias("_all_known"),
        (pl.col("_known") | pl.col("_unknown")).all().alias("_all"),
    )
    share = per_call.group_by(S.RANK, S.TID, "candidate").agg(
        pl.col("_all_known").mean().alias("_share_known"),
        pl.col("_all").mean().alias("_share_any"),
    )
    # evidence from members' calls of known groups first; else from any call
    picks = []
    for column in ("_share_known", "_share_any"):
        ranked = (
            share.sort(column, descending=True)
            .group_by(S.RANK, S.TID)
            .agg(
                pl.col("candidate").first().alias("_group"),
                pl.col(column).first().alias("_best"),
                pl.col(column).slice(1, 1).first().fill_null(0.0).alias("_next"),
            )
        )
        clear = (pl.col("_best") >= MIN_SHARE) & (pl.col("_best") - pl.col("_next") >= MIN_MARGIN)
        picks.append(ranked.filter(clear).select(S.RANK, S.TID, "_group"))
    return pl.concat(picks).unique([S.RANK, S.TID], keep="first", maintain_order=True)


def with_group_columns(calls: pa.Table, groups: Groups) -> pa.Table:
    """``calls`` with ``dim`` and ``group_ranks`` appended: the mesh dimension and the ranks of
    each call's group, where the run declares it (null otherwise: no group, or one undeclared)."""
    names = pa.array([g.name for g in groups.groups], pa.string())
    dims = pa.array([g.dim for g in groups.groups], pa.string())
    ranks = pa.array([g.ranks for g in groups.groups], pa.list_(pa.int32()))
    group = calls.column(S.GROUP).cast(pa.string())
    at = pc.index_in(group, value_set=names)  # null where the group is not declared
    return calls.append_column(
        pa.field(S.DIM, pa.string()),
        pc.take(dims, at) if len(names) else pa.nulls(len(at), pa.string()),
    ).append_column(
        pa.field(S.GROUP_RANKS, pa.list_(pa.int32())),
        pc.take(ranks, at) if len(names) else pa.nulls(len(at), pa.list_(pa.int32())),
    )
