"""Parameter-server jobs: who each process is, whether the workers keep in lockstep, and what
the processes without steps (servers, schedulers, coordinators) did.

A ps-lite job (MXNet's ``dist_sync``/``dist_async`` KVStore) runs workers, servers and one
scheduler; a TensorFlow parameter-server job a chief (the coordinator), workers and parameter
servers. Only workers run training steps. The role of each process comes from how ``traceview
collect`` launched it (``DMLC_ROLE``, ``TF_CONFIG``'s task type) or, for traces read on their
own, from the trace (a process that runs only sums of pushes and optimizer updates, and marks
no step, is a server: ``normalize/mxnet_engine.py``). Synchrony comes from what the job said
(the KVStore's type), else from the servers' traces (a synchronous server sums the workers'
pushes of a key before one update; an asynchronous one applies each push at once), else from
the workers' pace (lockstep workers finish their steps at one rate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.attribution.intervals import merge_intervals
from traceview.model import schema as S
from traceview.model.manifest import ROLE_NAMES, SERVICE_ROLES, Manifest
from traceview.model.results import Cause, RankSummary, ServerSummary

KNOWN_ROLES = frozenset(ROLE_NAMES.values())
#: A server busy more than this share of its span holds the workers back: their pushes queue.
SERVER_BOTTLENECK_BUSY = 0.8
#: Workers whose step rates differ by more than this do not wait for each other.
ASYNC_RATE_SPREAD = 0.25


def server_figures(events: pa.Table, sums: int) -> dict[str, float | int | None]:
    """What a server's trace shows (its events, schema.EVENTS_SCHEMA): the optimizer updates it
    applied and their mean time, the sums it made, how busy its operators kept it."""
    ops = events.filter(pc.equal(events[S.KIND], S.KIND_OP))
    start = ops[S.TS_NS].to_numpy().astype(np.int64)
    end = start + ops[S.DUR_NS].to_numpy().astype(np.int64)
    if len(start) == 0:
        return {"updates": 0, "update_ms": None, "sums": sums, "busy": None, "span_ms": None}
    order = np.argsort(start, kind="stable")
    s, e = merge_intervals(start[order], end[order])
    span = int(end.max() - start.min())
    update = pc.equal(ops[S.PHASE], S.UPDATE).to_numpy(zero_copy_only=False)
    durations = (end - start)[np.asarray(update, bool)]
    return {
        "updates": len(durations),
        "update_ms": round(float(durations.mean()) / 1e6, 4) if len(durations) else None,
        "sums": sums,
        "busy": round(float((e - s).sum()) / span, 4) if span > 0 else None,
        "span_ms": round(span / 1e6, 3),
    }


@dataclass
class Roles:
    """The run's architecture, its synchrony, each worker's busy fraction and the servers."""

    architecture: str = "collective"
    synchronous: bool | None = True
    known_from: str | None = None
    roles: dict[int, str] = field(default_factory=dict)  # rank -> role (workers too)
    busy: dict[int, float] = field(default_factory=dict)  # worker rank -> busy fraction
    rates: dict[int, float] = field(default_factory=dict)  # worker rank -> steps per second
    ran: dict[int, int] = field(default_factory=dict)  # worker rank -> its steps
    gaps: dict[int, float] = field(default_factory=dict)  # worker rank -> ms between steps
    # worker rank -> other workers' updates between its pull and its push, per step (async)
    staleness: dict[int, float] = field(default_factory=dict)
    servers: list[ServerSummary] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # roles expected and not read


def busy_fractions(steps: pl.DataFrame) -> dict[int, float]:
    """Per rank: time inside its steps ÷ from its first step's start to its last step's end."""
    if steps.height == 0:
        return {}
    per = steps.group_by(S.RANK).agg(
        pl.col(S.WALL_NS).sum().alias("inside"),
        (pl.col(S.END_NS).max() - pl.col(S.START_NS).min()).alias("span"),
    )
    return {
        int(r): round(min(1.0, inside / span), 4)
        for r, inside, span in per.select(S.RANK, "inside", "span").iter_rows()
        if span and span > 0
    }


def _rates(steps: pl.DataFrame) -> dict[int, float]:
    """Per rank: steps per second, from its steps' starts (the steps between its first step's
    start and its last one's, over that time)."""
    per = steps.group_by(S.RANK).agg(
        pl.len().alias("n"), (pl.col(S.START_NS).max() - pl.col(S.START_NS).min()).alias("span")
    )
    return {int(r): (n - 1) / (span / 1e9) for r, n, span in per.iter_rows() if n > 1 and span > 0}


def _gaps(steps: pl.DataFrame) -> dict[int, float]:
    """Per rank: the mean time from the end of one of its steps to the start of its next."""
    per = (
        steps.sort(S.RANK, S.START_NS)
        .with_columns((pl.col(S.START_NS) - pl.col(S.END_NS).shift(1)).over(S.RANK).alias("gap"))
        .group_by(S.RANK)
        .agg(pl.col("gap").drop_nulls().clip(lower_bound=0).mean())
    )
    return {int(r): round(gap / 1e6, 3) for r, gap in per.iter_rows() if gap is not None}


def staleness(steps: pl.DataFrame) -> dict[int, float]:
    """Per worker of an asynchronous job: the other workers' updates that reached the servers
    between its pull and its push, per step. Each step ends with the worker's push and pull, so
    what it computed on is the pull at its previous step's end: the others' step ends after that
    and up to its own end are the updates it did not see. Over the time every worker has steps
    (profile windows of different workers cover different times)."""
    if steps.height == 0 or steps[S.RANK].n_unique() < 2:
        return {}
    bounds = steps.group_by(S.RANK).agg(pl.col(S.START_NS).min(), pl.col(S.END_NS).max())
    lo = int(bounds.select(pl.col(S.START_NS).max()).item())
    hi = int(bounds.select(pl.col(S.END_NS).min()).item())
    if hi <= lo:
        return {}
    frame = steps.sort(S.RANK, S.END_NS).with_columns(
        pl.col(S.END_NS).shift(1).over(S.RANK).alias("pulled")
    )
    ends = frame[S.END_NS].to_numpy()
    ranks = frame[S.RANK].to_numpy()
    out: dict[int, float] = {}
    for rank in np.unique(ranks).tolist():
        mine = frame.filter(
            (pl.col(S.RANK) == rank) & pl.col("pulled").is_not_null()
            & (pl.col("pulled") >= lo) & (pl.col(S.END_NS) <= hi)
        )  # fmt: skip
        if mine.height == 0:
            continue
        others = np.sort(ends[ranks != rank])
        seen = np.searchsorted(others, mine[S.END_NS].to_numpy(), side="right")
        before = np.searchsorted(others, mine["pulled"].to_numpy(), side="right")
        out[int(rank)] = round(float((seen - before).mean()), 3)
    return out


def run_roles(
    manifest: Manifest,
    steps: pl.DataFrame,
    record: Callable[[], pl.DataFrame | None] | None = None,
) -> Roles:
    """Who each process of the run is and whether the workers keep in lockstep; ``record``
    reads every step of the run (the step record, where collect kept one), for the staleness of
    an asynchronous job's updates (read only for such a job)."""
    roles = {r.rank: r.role for r in manifest.ranks if r.role in KNOWN_ROLES}
    collect = manifest.collect
    others = list(collect.processes) if collect is not None else []
    said = _said_synchronous(manifest)
    if not roles and not others and said is None:
        return Roles()
    servers = [r for r in manifest.ranks if r.role in SERVICE_ROLES]  # (believed roles only)
    workers = sorted({r for r in steps[S.RANK].unique().to_list()} if steps.height else set())
    for rank in workers:
        roles.setdefault(rank, "worker")
    sources = sorted({r.role_from for r in manifest.ranks if r.role_from})
    known = f"roles from {', '.join(sources)}" if sources else "roles from collect"
    summaries = [_server_summary(r) for r in servers]
    synchronous, how = _synchrony(said, servers, steps, len(workers))
    kept = record() if record is not None and synchronous is False else None
    timeline = kept if kept is not None and kept.height else steps
    missing = []
    if not any(r.role == "server" for r in servers) and not any(p.role == "server" for p in others):
        missing.append("server")
    if not workers:
        missing.append("worker")
    # (a TensorFlow worker runs the closures a coordinator hands it: the job had a chief)
    handed = any((r.meta.get("task") or {}).get("executions") for r in manifest.ranks)
    if handed and not (
        any(r.role == "chief" for r in servers) or any(p.role == "chief" for p in others)
    ):
        missing.append("chief")
    return Roles(
        architecture="parameter_server",
        synchronous=synchronous,
        known_from=f"{known}; {how}",
        roles=roles,
        busy=busy_fractions(steps),
        rates=_rates(steps) if steps.height else {},
        ran={int(r): int(n) for r, n in steps[S.RANK].value_counts().iter_rows()}
        if steps.height
        else {},
        gaps=_gaps(steps) if steps.height else {},
        staleness=staleness(timeline) if synchronous is False else {},
        servers=summaries,
        missing=missing,
    )


def _said_synchronous(manifest: Manifest) -> bool | None:
    """Synchrony as the job said it (the KVStore's type, as collect recorded it), else None."""
    said = manifest.collect.ranks if manifest.collect is not None else []
    kinds = {str(r.kvstore) for r in said if r.kvstore}
    if any("async" in k for k in kinds):
        return False
    if any(k.startswith("dist") for k in kinds):
        return True
    return None


def _synchrony(
    said: bool | None, servers: list, steps: pl.DataFrame, workers: int
) -> tuple[bool | None, str]:
    if said is not None:
        return said, "synchrony from the KVStore's type"
    if any(r.role == "chief" for r in servers):
        return False, "asynchronous: a coordinator hands each step to whichever worker is free"
    sums = [r.meta.get("server", {}).get("sums") for r in servers]
    updates = [r.meta.get("server", {}).get("updates") for r in servers]
    if workers > 1 and any(u for u in updates if u):
        if any(s for s in sums if s):
            return True, "synchronous: the servers sum the workers' pushes before each update"
        return False, "asynchronous: the servers apply each push at once, summing none"
    rates = _rates(steps) if steps.height else {}
    if len(rates) > 1:
        low, high = min(rates.values()), max(rates.values())
        if high > low * (1 + ASYNC_RATE_SPREAD):
            return False, "asynchronous: the workers ran at different step rates"
        return True, "synchronous assumed: the workers kept one step rate"
    return None, "synchrony not known"


def _server_summary(entry) -> ServerSummary:  # type: ignore[no-untyped-def]
    figures = entry.meta.get("server") or {}
    busy = figures.get("busy")
    return ServerSummary(
        rank=entry.rank,
        role=entry.role,
        host=entry.host,
        updates=int(figures.get("updates") or 0),
        update_ms=figures.get("update_ms"),
        sums=int(figures.get("sums") or 0),
        busy_fraction=busy,
        span_ms=figures.get("span_ms"),
        bottleneck=busy is not None and busy > SERVER_BOTTLENECK_BUSY,
        dispatched=_int((entry.meta.get("task") or {}).get("dispatched")),
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


#: A worker this much slower than the others (in steps per second) is what limits an
#: asynchronous job's throughput.
SLOW_WORKER = 0.05
_KIND_OF_PHASE = {S.IO: "io", S.COMM: "transfer", S.IDLE: "idle"}


def roles_cause(roles: Roles, ranks: list[RankSummary]) -> Cause | None:
    """The verdict a parameter-server job gets from its roles (None: the critical path's
    stands): a server busy most of the time holds every worker back; in an asynchronous job,
    where nobody waits, the slowest worker's largest excess over the others limits the job's
    throughput (steps per second over all workers)."""
    busy = [s for s in roles.servers if s.bottleneck and s.busy_fraction is not None]
    workers = [r for r in ranks if r.step_ms > 0]
    if busy and workers:
        server = max(busy, key=lambda s: s.busy_fraction or 0.0)
        waits = float(np.mean([r.comm_exposed_ms for r in workers]))
        step = float(np.mean([r.step_ms for r in workers]))
        each = f" ({server.update_ms:.2f} ms an update)" if server.update_ms else ""
        return Cause(
            kind="server",
            rank=server.rank,
            phase=S.COMM,
            op="update",
            ms=round(waits, 3),
            blamed_ms=round(waits, 3),
            change=f"server:rank={server.rank}",
            step_ms=round(step - waits, 3),
            speedup=round(step / (step - waits), 2) if step > waits else 1.0,
            text=(
                f"server rank {server.rank} is busy {server.busy_fraction:.0%} of the time "
                f"applying {server.updates} updates{each}: the workers' pushes queue behind it, "
                f"{waits:.2f} ms of their {step:.2f} ms step; more servers would spread the keys"
            ),
        )
    if roles.synchronous is not False or not workers:
        return None
    rates = {r.rank: roles.rates.get(r.rank, 1e3 / r.step_ms) for r in workers}
    slow = _slow_worker(roles, workers, rates)
    idle = _dispatch(roles, workers, rates)
    if idle is not None and (slow is None or idle.speedup > slow.speedup):
        return idle
    return slow


#: Workers kept idle between the closures a coordinator hands them cost the job this much of its
#: steps per second (the steps they would run back to back) before that is the verdict.
DISPATCH_FLOOR = 0.10


def _dispatch(roles: Roles, workers: list[RankSummary], rates: dict[int, float]) -> Cause | None:
    """A coordinator's workers idling between its closures: the job's steps per second against
    what the workers would run back to back (each at one step per step time)."""
    chief = next((s for s in roles.servers if s.role == "chief"), None)
    if chief is None:
        return None
    actual = sum(rates.values())
    gapless = sum(1e3 / r.step_ms for r in workers)
    if actual <= 0 or gapless <= actual * (1 + DISPATCH_FLOOR):
        return None
    gap = float(np.mean([roles.gaps.get(r.rank, 0.0) for r in workers]))
    step = float(np.mean([r.step_ms for r in workers]))
    busy = ", ".join(
        f"rank {r.rank} {roles.busy[r.rank]:.0%}" for r in workers if r.rank in roles.busy
    )
    speedup = gapless / actual
    return Cause(
        kind="dispatch",
        rank=chief.rank,
        phase=S.IDLE,
        op=None,
        ms=round(gap, 3),
        blamed_ms=round(gap, 3),
        change="dispatch",
        step_ms=round(step, 3),
        speedup=round(speedup, 2),
        text=(
            f"the workers idle between the steps their coordinator (rank {chief.rank}) hands "
            f"them: {gap:.2f} ms between steps of {step:.2f} ms on average (busy: {busy}). "
            f"Kept busy, they would train at {speedup:.2f}x the steps per second"
        ),
    )


def _slow_worker(roles: Roles, workers: list[RankSummary], rates: dict[int, float]) -> Cause | None:
    """In an asynchronous job, the slowest worker's largest excess over the others."""
    if len(workers) < 2:
        return None
    slow = min(workers, key=lambda r: (rates[r.rank], -r.rank))
    others = [r for r in workers if r.rank != slow.rank]
    typical = float(np.median([rates[r.rank] for r in others]))
    if rates[slow.rank] >= typical * (1 - SLOW_WORKER):
        return None
    excess = {
        phase: getattr(slow.breakdown_ms, phase)
        - float(np.median([getattr(r.breakdown_ms, phase) for r in others]))
        for phase in S.BREAKDOWN_PHASES
    }
    phase = max(excess, key=lambda p: excess[p])
    ms = max(0.0, excess[phase])
    if ms <= 0 or ms >= slow.step_ms:
        return None
    faster = rates[slow.rank] * slow.step_ms / (slow.step_ms - ms)
    total = sum(rates.values())
    speedup = (total - rates[slow.rank] + faster) / total
    fastest = max(others, key=lambda r: rates[r.rank])
    kind = _KIND_OF_PHASE.get(phase, "compute")
    return Cause(
        kind=kind,  # type: ignore[arg-type]
        rank=slow.rank,
        phase=phase,  # type: ignore[arg-type]
        op=None,
        ms=round(ms, 3),
        blamed_ms=round(getattr(slow.breakdown_ms, phase), 3),
        change=f"balance:rank={slow.rank}",
        step_ms=round(slow.step_ms - ms, 3),
        speedup=round(speedup, 2),
        text=(
            f"asynchronous: the workers do not wait for each other; rank {slow.rank} is the "
            f"slowest ({rates[slow.rank]:.1f} steps/s against {rates[fastest.rank]:.1f} on rank "
            f"{fastest.rank}) for its {phase}, {ms:.2f} ms a step above the other workers'. "
            f"Without it the job would train at {speedup:.2f}x the steps per second"
        ),
    )
