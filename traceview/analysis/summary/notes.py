"""The report's warnings about the data: clocks, collectives not matched, groups unknown, calls
without a peer."""

from __future__ import annotations

import pyarrow as pa

from traceview.analysis.crossrank import ClockFit, CrossRank
from traceview.analysis.summary.ranks import _job
from traceview.model.manifest import Manifest
from traceview.model.results import Clocks


def _needs_clock_estimate(manifest: Manifest) -> bool:
    """Whether the ranks' clocks may differ: not all measured by ``collect``, not one host."""
    collected = manifest.collect
    if collected and collected.ranks and all(r.clock.method == "tcp" for r in collected.ranks):
        return False
    hosts = {r.host for r in manifest.ranks if r.events > 0}
    return not (len(hosts) == 1 and None not in hosts)


def _clocks(
    manifest: Manifest, n_ranks: int, cross: CrossRank | None, estimate: bool
) -> Clocks | None:
    if n_ranks < 2:
        return None
    if not estimate:
        job = _job(manifest.collect)
        if job is not None and job.clock_method == "tcp":
            return Clocks(source="collect", max_offset_us=job.max_clock_offset_us)
        return Clocks(source="one host")
    if cross is None:  # not matched across ranks (a rank is missing): nothing was estimated
        return None
    fit: ClockFit | None = cross.clocks
    if fit is None:
        return Clocks(source="unaligned")
    return Clocks(
        source="collectives",
        calls=fit.calls,
        max_offset_us=round(max(abs(o) for o in fit.offset_ns.values()) / 1e3, 1),
        max_drift_ppm=round(max(abs(d) for d in fit.drift.values()) * 1e6, 2),
        residual_us=round(fit.residual_ns / 1e3, 1),
        unaligned_ranks=fit.unaligned,
    )


def _clock_warning(clocks: Clocks | None) -> list[str]:
    if clocks is None:
        return []
    if clocks.source == "unaligned":
        return [
            "the ranks ran on several hosts (or their hosts are unknown), were not aligned by "
            "collect, and no synchronizing collective (all-reduce, all-gather...) was matched to "
            "estimate their clocks: arrival times across ranks assume the clocks agree"
        ]
    if clocks.unaligned_ranks:
        which = ", ".join(map(str, clocks.unaligned_ranks[:10]))
        return [
            f"rank(s) {which}: too few synchronizing collectives matched with rank 0 to estimate "
            "their clocks; their arrival times assume their clock agrees with rank 0's"
        ]
    return []


def _not_matched(manifest: Manifest, collectives: pa.Table | None) -> list[str]:
    """Why a run with collective calls has no wait/transfer split: ranks are missing."""
    if not manifest.missing_ranks or collectives is None or collectives.num_rows == 0:
        return []
    return [
        "collectives are not matched across ranks while ranks of the job are missing (any of "
        "them may be the last to arrive): communication is not split into wait and transfer"
    ]


def _ungrouped(cross: CrossRank | None) -> list[str]:
    if cross is None or not cross.ungrouped:
        return []
    return [
        f"{cross.ungrouped} collective call(s) of ranks that are members of several process "
        "groups do not say which group they belong to, and their calls' ends do not tell it "
        "clearly: they are left unmatched"
    ]


def _no_peer(cross: CrossRank | None) -> list[str]:
    if cross is None or not cross.matched.no_peer:
        return []
    counts = cross.matched.no_peer
    which = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items())[:10])
    more = " ..." if len(counts) > 10 else ""
    return [
        f"{sum(counts.values())} point-to-point call(s) do not say their peer ({which}{more}): "
        "they are left unmatched, out of wait and transfer; the paired ones are analysed"
    ]


def _unmatched(cross: CrossRank | None) -> list[str]:
    if cross is None or not cross.matched.unmatched:
        return []
    counts = cross.matched.unmatched
    total = sum(counts.values())
    which = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items())[:10])
    more = " ..." if len(counts) > 10 else ""
    return [
        f"{total} collective call(s) have no counterpart on every rank of their group "
        f"({which}{more}): a rank died, its trace was cut short, its profile covers other "
        "steps, or the framework issued them differently; they are left out of wait and "
        "transfer, the matched ones are analysed"
    ]
