"""Analyses as sections of the run report: a section has a name, computes a typed result from a
``Context`` (the run's inputs and the results of the sections it asks for, each computed once,
when first asked for) and places it in the report (its fields, warnings and remarks, and the
verdicts it settles), in the order the report lists them (``assemble.SECTIONS``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa

from traceview.model.manifest import Manifest
from traceview.model.results.live import ProfileWindow

if TYPE_CHECKING:
    from traceview.analysis.critical_path import PathCache
    from traceview.analysis.crossrank import CrossRank
    from traceview.model.choice import StepChoice
    from traceview.model.columns import TableOnDemand

T = TypeVar("T")

#: A side input's rows of some ranks (all when None), read when a section asks for them.
SideReader = Callable[[list[int] | None], pa.Table]
#: The step record's steps, calls and ranks (schema.RECORD_*), and what reading it set aside.
RecordTables = tuple[pa.Table, pa.Table, pa.Table, list[str]]


@dataclass
class RunInputs:
    """What a report is computed from: the manifest; the per-rank analysis tables by name
    (analysis.RANK_TABLES: "steps" and "ops" at least; one absent is not there to read: its
    section says nothing); the segments (None: an older run directory, no critical path); the
    cross-rank pass over every step (None: none made, wait and transfer unknown); the side
    inputs the run has, by name (schema.SIDE_INPUTS; one absent is unknown, not empty); the
    run directory (None: a temporary one) and where the critical path of an earlier report of
    it is kept."""

    manifest: Manifest
    tables: Mapping[str, pa.Table]
    segments: TableOnDemand | None = None
    cross: CrossRank | None = None
    side: Mapping[str, SideReader] = field(default_factory=dict)
    path: str | None = None
    path_cache: PathCache | None = None
    # the step record the ranks kept under collect (schema.RECORD_STEPS, _CALLS, _RANKS, and
    # what reading it set aside), read when asked; None: the run has none
    record: Callable[[], RecordTables | None] | None = None
    # the run's profile windows (runs.windows: collect's own and those asked of the job)
    windows: list[ProfileWindow] = field(default_factory=list)

    def table(self, name: str) -> pa.Table | None:
        return self.tables.get(name)


@dataclass
class ReportOptions:
    """How a report is asked for: ``top`` operators; ``choice``: the steps --steps/--skip
    chose (None: leading warm-up steps left out); ``whatif``: changes to replay besides the
    report's own (WhatIf.change)."""

    top: int = 10
    choice: StepChoice | None = None
    whatif: list[str] = field(default_factory=list)


@dataclass
class Draft:
    """The report as the sections place it: its fields by name (``RunReport``'s), and its
    warnings and remarks in the order the sections add them."""

    fields: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    remarks: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Section(Generic[T]):
    """``compute``: the section's result from the context (pure: it changes nothing it was
    given); ``place``: the result put in the report, where the verdicts it settles are made."""

    name: str
    compute: Callable[[Context], T]
    place: Callable[[T, Draft], None] = lambda result, draft: None


class Context:
    """A report's inputs and options, and the results of its sections, each computed once, when
    a section (or the report) first asks for it."""

    _COMPUTING = object()

    def __init__(self, inputs: RunInputs, options: ReportOptions):
        self.inputs, self.options = inputs, options
        self.manifest = inputs.manifest
        self._results: dict[str, Any] = {}

    def get(self, section: Section[T]) -> T:
        found = self._results.get(section.name)
        if found is Context._COMPUTING:
            raise RuntimeError(f"report section {section.name!r} asks for itself")
        if found is None and section.name not in self._results:
            self._results[section.name] = Context._COMPUTING
            found = self._results[section.name] = section.compute(self)
        return found  # type: ignore[return-value]
