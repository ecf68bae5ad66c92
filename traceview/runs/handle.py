"""``Run``: an open run's manifest and tables, its analysis read or computed when first asked for."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.errors import BadInput, UsageError
from traceview.model.escape import safe
from traceview.model.manifest import Manifest
from traceview.model.results import (
    GatherSpan,
    PathStretch,
    ProfileWindow,
    RankTail,
    RunReport,
    StepCollective,
)
from traceview.runs.cache import PathFile
from traceview.store import rundir as R

if TYPE_CHECKING:
    from traceview.analysis.attribution import CommSchedule
    from traceview.analysis.crossrank import CrossRank
    from traceview.analysis.summary import RunInputs
    from traceview.analysis.summary.sections import RecordTables
    from traceview.model.choice import StepChoice
    from traceview.parsers.flight import DumpRecord


#: file names that are traces or tables, never a Flight Recorder dump (not opened to tell)
_NOT_DUMPS = (".gz", ".pb", ".pt.trace.json", ".parquet", ".bin", ".zst")


def flight_dumps(paths: list[Path]) -> DumpRecord | None:
    """The Flight Recorder dumps among ``paths`` (files, and folders' files), read; None where
    there are none."""
    from traceview.parsers.flight import find_dumps

    files: list[Path] = []
    for path in paths:
        try:
            if path.is_dir():
                files += sorted(
                    p for p in path.rglob("*")
                    if not p.name.startswith(".") and not p.name.endswith(_NOT_DUMPS)
                    and p.is_file()
                )  # fmt: skip
            elif path.is_file():
                files.append(path)
        except OSError:
            continue
    return find_dumps(files)


@dataclass
class Run:
    path: Path  # the run directory (temporary when read from traces)
    label: str  # how to name it to the user
    manifest: Manifest
    tables: dict[str, pa.Table]  # the per-rank analysis tables of every rank (RANK_TABLES) ...
    segments: TableOnDemand  # ... but the segments, the largest, read only where needed
    temporary: bool
    # the steps --steps/--skip chose (None: leading warm-up steps left out): every report of
    # this run counts them, once decided (analysis/selection.py)
    choice: StepChoice | None = None
    # the key its tables were read with (a run directory's current cache): what a report
    # keeps in the run directory records it too (None: nothing is kept)
    cache_key: bytes | None = None

    @property
    def steps(self) -> pa.Table:
        return self.tables["steps"]

    @property
    def ops(self) -> pa.Table:
        return self.tables["ops"]

    @property
    def collectives(self) -> pa.Table:
        return self.tables["collectives"]

    @cached_property
    def side_inputs(self) -> tuple[str, ...]:
        """The side inputs ingest read (schema.SIDE_INPUTS; some runs predate one: theirs are
        unknown), whose files are inside the run directory (a link out of it is not followed:
        ``reanalyze`` says so)."""
        return tuple(
            name
            for name in S.SIDE_INPUTS
            if (path := R.side_path(self.path, name)).is_file()
            and R.leads_out(self.path, path) is None
        )

    def side(self, name: str, ranks: list[int] | None = None) -> pa.Table | None:
        """The rows of side input ``name`` of ``ranks`` (all when None); None where the run has
        none (``side_inputs``), or where its file cannot be read (left out with a warning, as
        the analysis leaves it out: ``reanalysis``)."""
        if name not in self.side_inputs:
            return None
        try:
            return R.read_side(self.path, name, ranks)
        except BadInput as exc:
            warning = f"{S.SIDE_INPUTS[name].what} left out: {exc}"
            if warning not in self.manifest.notes.warnings:
                self.manifest.notes.warnings.append(warning)
            return None

    def report(self, top: int = 10, whatif: list[str] | None = None) -> RunReport:
        from traceview.analysis.summary import ReportOptions, summarize

        options = ReportOptions(top=top, choice=self.choice, whatif=whatif or [])
        try:
            return summarize(self.report_inputs(), options)
        except UsageError as exc:  # a step choice this run has no steps for: say which run
            raise UsageError(f"{safe(self.label)}: {exc}") from None

    def report_inputs(self) -> RunInputs:
        """What a report of this run is computed from (``analysis.summary.sections``)."""
        from functools import partial

        from traceview.analysis.summary import RunInputs

        return RunInputs(
            self.manifest,
            self.tables,
            segments=self.segments,
            cross=self.cross,
            side={name: partial(self.side, name) for name in self.side_inputs},
            record=self.step_record,
            windows=self.windows(),
            path=None if self.temporary else str(self.path),
            path_cache=(
                None if self.temporary or self.cache_key is None
                else PathFile(self.path, self.cache_key)
            ),
        )  # fmt: skip

    def windows(self) -> list[ProfileWindow]:
        """The profile windows of the run collect made that this run is (or is a window of):
        their steps (empty: not a run collect made)."""
        from traceview.runs.windows import list_windows

        root = self.path.parent.parent if self.manifest.window else self.path
        if self.temporary or (self.manifest.collect is None and not self.manifest.window):
            return []
        return list_windows(root, job_ended=True)

    def step_record(self) -> RecordTables | None:
        """The step record the ranks kept under collect (RUN/raw), or the Flight Recorder
        dumps found beside the traces, as tables; None: none. Read once."""
        return self._step_record

    @cached_property
    def _step_record(self) -> RecordTables | None:
        from traceview.parsers.flight import find_dumps
        from traceview.parsers.record import read_run_record

        raw = self.path / "raw"
        if self.manifest.window:  # (a profile window: the run's record, RUN/windows/K/../..)
            raw = self.path.parent.parent / "raw"
        if self.temporary:  # (a report of raw traces: their folder's record, if it is a run's)
            raw = next(
                (Path(p) / "raw" for p in self.manifest.inputs if (Path(p) / "raw").is_dir()), raw
            )
        found = read_run_record(raw)
        if found is not None:
            return found.steps, found.calls, found.ranks, found.warnings
        listed = self.manifest.flight_dumps
        dumps = (
            find_dumps([Path(p) for p in listed])
            if listed is not None
            else flight_dumps([Path(p) for p in self.manifest.inputs])
        )
        if dumps is None:
            return None
        return dumps.steps, dumps.calls, dumps.ranks, dumps.warnings

    def rank_tails(self) -> list[RankTail]:
        """Each rank's last steps of its step record and its last sign of life (empty: no
        record): how a failed job ended, as the TUI draws it."""
        from traceview.analysis.failure import rank_tails

        record = self.step_record()
        return rank_tails(record[0], record[2]) if record is not None else []

    @cached_property
    def cross(self) -> CrossRank | None:
        """The cross-rank pass over this run's tables (None where ranks are missing), once."""
        from traceview.analysis.summary import cross_rank_of

        return cross_rank_of(self.manifest, self.collectives, self.tables["comm"])

    def export_tables(self) -> dict[str, pa.Table]:
        """The tables ``export`` writes beside the events: steps, ops, the collective calls
        with what matching them across ranks found (``view``: host or device) and their group's
        dimension and ranks (schema.EXPORT_COLLECTIVES_SCHEMA), on GPU runs the gpu table and
        the launches tables, one grain each (``launch_grains``), and where the ranks kept a step
        record or left Flight Recorder dumps, its tables (schema.RECORD_*)."""
        from traceview.analysis.crossrank import matched_table
        from traceview.analysis.gpu import collective_views, launch_grains
        from traceview.analysis.groups import with_group_columns
        from traceview.analysis.summary import complete_flag, groups_of

        groups = self.cross.groups if self.cross is not None else groups_of(self.manifest)
        calls = with_group_columns(matched_table(self.collectives, self.cross), groups)
        tables = {
            "steps": complete_flag(self.steps, self.manifest, self.choice),
            "ops": self.ops,
            "collectives": collective_views(calls),
        }
        if self.tables["gpu"].num_rows:
            tables["gpu"] = self.tables["gpu"]
        if self.tables["launches"].num_rows:
            tables.update(launch_grains(self.tables["launches"]))
        path = self.critical_path()
        if path.num_rows:
            tables["critical_path"] = path
        for name in self.side_inputs:  # (runs without such rows: none)
            rows = self.side(name)
            if rows is not None and rows.num_rows:
                tables[name] = rows
        if "memory" in tables:
            tables["memory_steps"] = self.tables["memory_steps"]
        record = self.step_record()  # (the whole run's steps and calls, profiled or not)
        if record is not None:
            steps, calls, ranks, _ = record
            for name, rows in (("record_steps", steps), ("record_calls", calls)):
                if rows.num_rows:
                    tables[name] = rows
            tables["record_ranks"] = ranks
        return tables

    def critical_path(self) -> pa.Table:
        """The critical path of every step across ranks, a row per piece
        (schema.CRITICAL_PATH_SCHEMA), on the clock the collectives were matched on."""
        import polars as pl

        from traceview.analysis.critical_path import path_table
        from traceview.analysis.crossrank import Matched

        segments, cross = self.segments, self.cross
        if cross is not None and cross.clocks is not None:
            segments = cross.clocks.shifted_segments(segments)
        steps = sorted(set(self.steps.column(S.STEP).to_pylist()), key=lambda s: (s is None, s))
        matched = cross.matched if cross is not None else Matched(pl.DataFrame())
        return path_table(segments, matched, steps)

    def critical_path_stretches(self) -> dict[int | None, list[PathStretch]]:
        """Every step's critical path as the stretches the report lists (what the TUI draws)."""
        from traceview.analysis.critical_path import path_stretches

        return path_stretches(self.critical_path())

    def clock_offsets(self) -> dict[int, int]:
        """ns to subtract from each rank's times to put it on the run's clock, where they were
        estimated from collectives (traces from several hosts); empty otherwise."""
        fit = self.cross.clocks if self.cross is not None else None
        return {r: round(o) for r, o in fit.offset_ns.items()} if fit is not None else {}

    def step_collectives(self) -> dict[int | None, list[StepCollective]]:
        """Per step, its collective calls matched across ranks, the most skewed first."""
        from traceview.analysis.crossrank import matched_table, step_collectives

        return step_collectives(matched_table(self.collectives, self.cross))

    def collective_spans(self) -> dict[tuple[int, int | None], list[tuple[int, int]]]:
        """Per (rank, step), the [start, end) of each collective call that is not
        point-to-point, on the rank's own clock (as its events are): what a pipeline view
        draws as communication rather than bubble."""
        import polars as pl

        from traceview.analysis.crossrank import POINT_TO_POINT

        calls = pl.from_arrow(self.collectives)
        assert isinstance(calls, pl.DataFrame)
        calls = calls.filter(~pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT))
        spans: dict[tuple[int, int | None], list[tuple[int, int]]] = {}
        for rank, step, start, end in calls.select(
            S.RANK, S.STEP, S.START_NS, S.END_NS
        ).iter_rows():
            spans.setdefault((rank, step), []).append((start, end))
        return spans

    def gather_spans(self) -> dict[tuple[int, int | None], list[GatherSpan]]:
        """Per (rank, step), FSDP's all-gathers on the rank's own clock (the TUI's FSDP view)."""
        from traceview.analysis.fsdp import gather_spans

        return gather_spans(self.collectives)

    def events(self, ranks: list[int] | None = None) -> pa.Table:
        """The events of ``ranks`` (all when None); a rank refused when the run was opened
        (its events unreadable, another run's, or behind a link out of the run directory) is
        left out, as the analysis left it out."""
        return R.read_events(self.path, ranks, {}, self.manifest.run_id)

    def comm_schedules(self, report: RunReport) -> list[CommSchedule]:
        """The collectives ``scaling``'s layer-wise model replays, of a few ranks spread over
        the run (``sample_ranks``: their pattern repeats across ranks), read one at a time, in
        the steps ``report`` counts (``counted_schedules``)."""
        from traceview.analysis.scaling import counted_schedules, sample_ranks

        ranks = sample_ranks(self.manifest)
        return counted_schedules(report, (self.events([rank]) for rank in ranks))

    def window_events(self, rank: int, start_ns: int, end_ns: int) -> pa.Table:
        """The events of ``rank`` that overlap [start_ns, end_ns): only their row groups."""
        return R.read_window(self.path, rank, start_ns, end_ns, self.manifest.run_id)
