"""The analysis: pure functions from the normalized events to results.

Per rank (``rank_tables``): the steps table (the exclusive breakdown of every step,
``attribution``), the ops table (per-operator statistics, ``ops``) and the collective calls
(``collectives``: what cross-rank passes match). These are cached in the run directory as
steps.parquet, ops.parquet and collectives.parquet, stamped with ``ANALYSIS_VERSION``; a reader that
finds another version recomputes them from the events (``traceview.runs``), so a change of the
analysis never needs a re-ingest. Run-wide results (``summary``, ``compare``, ``scaling``) are
computed from those tables into ``traceview.results`` structs.
"""

from __future__ import annotations

import pyarrow as pa

#: Bump when a change alters the tables computed from the same events (RANK_TABLES).
ANALYSIS_VERSION = "3"  # 2: the collectives table; 3: its process groups

#: The per-rank tables, by the file name (without .parquet) they are cached under.
RANK_TABLES = ("steps", "ops", "collectives")


def rank_tables(events: pa.Table) -> dict[str, pa.Table]:
    """The per-rank analysis of one rank's events: {"steps", "ops", "collectives"}."""
    from traceview.analysis.attribution import breakdown
    from traceview.analysis.collectives import collective_calls
    from traceview.analysis.ops import op_stats

    return {
        "steps": breakdown(events),
        "ops": op_stats(events),
        "collectives": collective_calls(events),
    }
