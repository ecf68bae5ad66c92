"""The results of the analysis: typed, serialisable structs that every view renders.

The analysis (``traceview.analysis``) computes every figure and every verdict once into these
structs; the text report, ``--json`` and the TUI only render them. ``report --json`` is
``to_json(RunReport)``: its keys are a contract (docs/design.md, docs/schema/), so a
field is never removed or retyped once added, and data a run does not have is ``null``.

This module holds what every result shares: the ``Result`` base (JSON in and out), the
enumerated strings of the JSON, and the per-phase ``Breakdown``. Nothing here imports numpy,
polars or a UI library.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, TypeVar

import msgspec

from traceview.model.escape import encodable

#: The version of the result model (``schema_version`` of ``report --json``); bumped when a
#: field changes meaning. Adding a field does not bump it.
RESULTS_VERSION = "1"


class Result(msgspec.Struct, kw_only=True, gc=False):
    """Base of every result: JSON in and out."""

    def to_json(self) -> bytes:
        try:
            return msgspec.json.encode(self)
        except UnicodeEncodeError:  # a file name that is not UTF-8: its bytes escaped
            return msgspec.json.encode(encodable(msgspec.to_builtins(self)))

    def to_builtins(self) -> Any:
        return msgspec.to_builtins(self)


R = TypeVar("R", bound=Result)


def from_columns(cls: type[R], columns: dict[str, Any]) -> list[R]:
    """``[cls(**row) ...]`` for the rows of ``columns`` (every field of ``cls``, by name, each a
    sequence), each struct made by position: a keyword call a row is twice as slow (a report of
    100,000 tiny steps makes a million)."""
    if set(columns) != set(cls.__struct_fields__):
        raise ValueError(f"{cls.__name__} has the fields {cls.__struct_fields__}, not {[*columns]}")
    if len({len(column) for column in columns.values()}) > 1:
        raise ValueError(f"{cls.__name__}'s columns differ in length")
    return list(map(cls, *(columns[name] for name in cls.__struct_fields__)))


#: What the JSON's enumerated strings can be (a schema test keeps old values valid).
Phase = Literal["io", "h2d", "forward", "backward", "update", "comm", "other", "idle"]
#: "imbalance": communication is the largest share, but most of it is waiting for a straggler
BottleneckPhase = Literal[
    "io", "h2d", "forward", "backward", "update", "comm", "imbalance", "pipeline", "dispatch"
]
#: How the ranks' times were put on one clock: measured by ``collect``, shared by one host,
#: estimated from matched collectives, or not at all (several hosts, nothing to estimate from).
ClockSource = Literal["collect", "one host", "collectives", "unaligned"]
StragglerPhase = Literal["io", "h2d", "forward", "backward", "update", "other"]
Hidden = Literal["yes", "partly", "no", "n/a"]
Timeline = Literal["cpu", "gpu"]
StepMark = Literal["first", "warm-up", "slow", ""]
#: Why a step is left out of the headline figures (analysis/selection.py): a leading step well
#: above the median of the steps after it, not among the steps --steps/--skip chose, or a last
#: step of a tenth of the median or less (trailing: the profiler's window after the last step()).
StepExclusion = Literal["warm-up", "selection", "trailing"]
#: Where the steps come from: the trace's own markers, inferred from what repeats (how), or none
#: (the whole trace is one window).
StepsFrom = Literal[
    "markers",
    "step_groups",
    "session_runs",
    "annotations",
    "optimizer",
    "dataloader",
    "backward",
    "one_window",
]


def from_json(data: bytes | str, kind: type[R]) -> R:
    """A result read back from its JSON (``kind`` is the struct it was written from)."""
    return msgspec.json.decode(data, type=kind)


class Breakdown(Result):
    """Exclusive time per phase (ms): the phases of a step, each instant counted once."""

    io: float = 0.0
    h2d: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    update: float = 0.0
    comm: float = 0.0
    other: float = 0.0
    idle: float = 0.0

    def __getitem__(self, phase: str) -> float:
        if phase not in self.__struct_fields__:
            raise KeyError(phase)
        return float(getattr(self, phase))

    def items(self) -> Iterator[tuple[str, float]]:
        for phase in self.__struct_fields__:
            yield phase, self[phase]

    def total(self) -> float:
        return sum(value for _, value in self.items())

    @classmethod
    def of(cls, values: dict[str, float]) -> Breakdown:
        return cls(**{p: float(values.get(p, 0.0)) for p in cls.__struct_fields__})


# The breakdown's fields are the phases (schema.BREAKDOWN_PHASES), in report order: a test
# (tests/unit/test_results.py) holds them equal; this module imports no schema (nor pyarrow).
