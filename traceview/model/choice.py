"""What the user chose of a run's steps (``--steps A-B``, ``--skip N``): the input of
``analysis.selection``, parsed here so that every command and the TUI take it alike."""

from __future__ import annotations

import re
from dataclasses import dataclass

from traceview.model.errors import UsageError


@dataclass(frozen=True)
class StepChoice:
    """What the user asked for: ``--steps first-last`` (inclusive, the trace's step numbers)
    and/or ``--skip N`` (leave out the first N steps of the run)."""

    first: int | None = None
    last: int | None = None
    skip: int | None = None

    def describe(self) -> str:
        parts = []
        if self.first is not None:
            parts.append(f"--steps {self.first}-{self.last}")
        if self.skip is not None:
            parts.append(f"--skip {self.skip}")
        return " ".join(parts)


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def step_choice(steps: str | None, skip: int | None) -> StepChoice | None:
    """The choice from the command line's ``--steps`` and ``--skip`` (None: neither given).
    UsageError: a range that is not ``A-B`` or ``A`` with A <= B, a negative skip."""
    if steps is None and skip is None:
        return None
    first = last = None
    if steps is not None:
        found = _RANGE.match(steps)
        if found is None:
            raise UsageError(
                f"--steps {steps[:40]!r}: give a step number or a range A-B of the trace's "
                "step numbers (e.g. --steps 16-17)"
            )
        first = int(found.group(1))
        last = int(found.group(2)) if found.group(2) is not None else first
        if last < first:
            raise UsageError(f"--steps {first}-{last}: the range ends before it starts")
    if skip is not None and skip < 0:
        raise UsageError(f"--skip {skip}: give a number of steps, 0 or more")
    return StepChoice(first, last, skip)
