"""The analysis: pure functions from the normalized events to results.

Per rank (``rank_tables``): the steps table (the exclusive breakdown of every step,
``attribution``), the ops table (per-operator statistics, ``ops``) and the collective calls
(``collectives``: what cross-rank passes match), and the memory figures per device and step
(``memory_steps``, from the rank's memory records). These are cached in the run directory as
steps.parquet, ops.parquet, collectives.parquet, comm.parquet (a rank's communication as
exposed and hidden intervals), gpu.parquet and launches.parquet (GPU runs: the device's busy
and idle time per step, kernel-launch statistics; ``gpu``) and memory_steps.parquet, stamped
with ``ANALYSIS_VERSION``; a reader that
finds another version recomputes them from the events (``traceview.runs``), so a change of the
analysis never needs a re-ingest. Run-wide results (``summary``, ``compare``, ``scaling``) are
computed from those tables into ``traceview.model.results`` structs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from traceview.analysis.parts import ChunkedAnalysis

#: Bump when a change alters the tables computed from the same events (RANK_TABLES).
#: 2: the collectives table; 3: its process groups; 4: the comm table; 5: kernels as calls;
#: 6: the gpu and launches tables (analysis/gpu.py); 7: the memory_steps table; 8: host-bound
#: time in the breakdown of GPU timelines (steps: host_bound_<phase>_ns); 9: a synchronize at the
#: top of a step, outside every operator, is not host-bound; 10: nor is the training thread's
#: backward region fill where another thread runs backward (PyTorch's autograd thread); 11: the
#: launches table splits the launch delay into queueing and launch latency; 12: the collectives
#: table gains issued_ns, peer and issued_in, the timeline the queued stretch of a call; 13: the
#: segments table (each window's exclusive segments in time order: the critical path's input);
#: 14: a region inside an operator keeps the operator's level; 15: the collectives table gains
#: split_imbalance; 16: segments where the device waits for a kernel launch are ``launch``;
#: 17: the collectives table gains unit, prefetched and needed_ns (FSDP); 18: the ops table is
#: per step (null: outside every step); 19: a communication region inside an operator is
#: communication (a collective called inside an autograd Function); 20: the actions table
#: (pipeline actions: what names a virtual stage's own work); 21: host-bound time inside a
#: runtime call that launches nothing (cudaMalloc) is host-bound, named by the call, not launch
ANALYSIS_VERSION = "22"


def __getattr__(name: str) -> Any:
    """``RANK_TABLES``, made when first asked for (the package imports no pyarrow: what only
    looks at a running job, analysis.live, needs none)."""
    if name != "RANK_TABLES":
        raise AttributeError(f"module 'traceview.analysis' has no attribute {name!r}")
    from traceview.model import schema as S

    #: The per-rank tables, by the file name (without .parquet) they are cached under, and their
    #: shape (a cached table of another shape is damaged, and recomputed).
    tables: dict[str, pa.Schema] = {
        "steps": S.STEPS_SCHEMA,
        "ops": S.OPS_SCHEMA,
        "collectives": S.COLLECTIVES_SCHEMA,
        "comm": S.COMM_SCHEMA,
        "gpu": S.GPU_SCHEMA,
        "launches": S.LAUNCHES_SCHEMA,
        "memory_steps": S.MEMORY_STEPS_SCHEMA,
        "segments": S.SEGMENTS_SCHEMA,
        "actions": S.ACTIONS_SCHEMA,
    }
    globals()["RANK_TABLES"] = tables
    return tables


def _rank_tables(
    events: pa.Table, side: Mapping[str, pa.Table] | None = None, rows: bool = True
) -> dict[str, pa.Table]:
    """The whole rank as one part of ``analysis.parts``: the same code a rank read in chunks
    takes, its facts found over the whole rank (so they hold). ``rows=False``: without the
    per-event tables (``RankTables.rows`` makes those of many ranks at once)."""
    import numpy as np

    from traceview.analysis.attribution import whole_rank_part
    from traceview.analysis.parts import EVERYWHERE, ChunkedAnalysis
    from traceview.model.columns import EventArrays

    ev = EventArrays.of(events)  # (made once: the facts, the chunk and its slice read them)
    training, gpu, elsewhere, whole = whole_rank_part(events, ev)
    analysis = ChunkedAnalysis(side or {}, training, gpu, elsewhere, whole)
    if not rows:
        analysis.rows = None
    every = np.ones(events.num_rows, bool)
    analysis.add(events, every, every, -EVERYWHERE, EVERYWHERE, ev)
    tables = analysis.finish()
    if tables is None:  # (facts found over the whole rank hold by construction)
        raise RuntimeError("the whole rank's facts did not hold for its analysis")
    return tables


class RankTables:
    """``rank_tables(events, side)``: the per-rank analysis of one rank's events and side inputs
    (by name, schema.SIDE_INPUTS: its memory records): {"steps", "ops", "collectives", "comm",
    "gpu", "launches", "memory_steps", "segments"} (gpu and launches empty on CPU runs,
    memory_steps without memory records).

    ``rank_tables.chunked(side)``: the same for a rank normalized in chunks, fed a chunk at a
    time (``analysis.parts``): a maker of the analysis from what the whole rank holds (its
    training thread, whether it has device activities, whether another thread runs backward,
    and its one window where it has no step markers).
    """

    #: What a process that runs the analysis in chunks imports (ahead, while it waits).
    modules: tuple[str, ...] = ("traceview.analysis.parts",)

    def __call__(
        self, events: pa.Table, side: Mapping[str, pa.Table] | None = None, *, rows: bool = True
    ) -> dict[str, pa.Table]:
        """``rows=False``: all but the per-event tables (ops, collectives, actions), which
        ``rows`` makes for many ranks at once."""
        return _rank_tables(events, side, rows)

    def rows(self, ranks: list[pa.Table]) -> dict[str, pa.Table]:
        """The per-event tables (ops, collectives, actions) of several whole ranks' events at
        once, each rank's rows as its own analysis gives them, rank after rank: a small rank's
        few hundred calls to make them are paid once for a batch of ranks (``ingest.batches``)."""
        import numpy as np

        from traceview.analysis.parts import EVERYWHERE, RowParts, ranks_as_one

        events = ranks_as_one(ranks)
        every = np.ones(events.num_rows, bool)
        parts = RowParts()
        parts.add(events, every, every, -EVERYWHERE, EVERYWHERE)
        return parts.finish()

    def chunked(
        self, side: Mapping[str, pa.Table], spill: Path | None = None
    ) -> Callable[[tuple[int, int], bool, bool, tuple[int, int] | None], ChunkedAnalysis]:
        """``spill``: where the segments are written as they are made (``ChunkedAnalysis``)."""
        from traceview.analysis.parts import ChunkedAnalysis

        def make(
            training: tuple[int, int], gpu: bool, elsewhere: bool, whole: tuple[int, int] | None
        ) -> ChunkedAnalysis:
            return ChunkedAnalysis(side, training, gpu, elsewhere, whole, spill)

        return make


rank_tables = RankTables()
