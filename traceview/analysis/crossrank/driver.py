"""The cross-rank pass (``cross_rank``): each call's group told, the calls matched, the clocks
estimated where asked, then the waits split and attributed; ``CrossRank`` holds what it finds.

Runs on the per-rank tables (``collectives``, ``comm`` and ``steps``), never on events, so it
costs the same whatever the traces weigh. Vectorized with polars: a join per process group and
view, no per-call Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from traceview.analysis.crossrank.clocks import ClockFit, estimate_clocks
from traceview.analysis.crossrank.matching import Matched, match_collectives
from traceview.analysis.crossrank.waits import Arrivals, arrivals, split_waits
from traceview.analysis.groups import Groups, assign_groups
from traceview.model import schema as S


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
