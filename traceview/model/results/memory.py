"""Memory of the report: per step, per device, per rank and across ranks (MiB)."""

from __future__ import annotations

from typing import Literal

from traceview.model.results.base import Phase, Result

#: How a rank's allocated memory moves across steps (analysis/memory.py): "leak" grew at every
#: step, "creep" at most steps, "steady" otherwise.
Growth = Literal["leak", "creep", "steady"]


class StepMemory(Result):
    """Allocated memory of one device in one step window (MiB: 2**20 bytes)."""

    step: int | None
    start_mb: float | None  # when the step starts (what the last record before it left)
    end_mb: float | None  # when it ends
    peak_mb: float | None  # the most at any instant of the step
    peak_phase: Phase | None = None


class DeviceMemory(Result):
    """One device of one rank: what its allocator held (MiB: 2**20 bytes). Null: not recorded."""

    peak_mb: float | None  # the most allocated at once over the trace
    peak_phase: Phase | None  # the phase running when it peaked
    peak_op: str | None  # the operator running then (untrusted: from the trace)
    peak_step: int | None  # the step it peaked in (null: outside the steps, or unnumbered)
    reserved_peak_mb: float | None  # the allocator's reserve at its largest (null on CPU)
    start_mb: float | None  # when the first step starts
    end_mb: float | None  # when the last step ends
    growth_mb_per_step: float | None  # least-squares slope of the steps' end (null: < 3 steps)
    growth: Growth | None
    since_profiling_started: bool  # counts only allocations made while profiling (CPU)
    steps: list[StepMemory] = []


class RankMemory(Result):
    """A rank's memory: the figures of its main device (an accelerator where it has one, else
    the CPU), and every device's in ``by_device``."""

    device: str
    peak_mb: float | None
    peak_phase: Phase | None
    peak_op: str | None
    peak_step: int | None
    reserved_peak_mb: float | None
    growth_mb_per_step: float | None
    growth: Growth | None
    since_profiling_started: bool
    by_device: dict[str, DeviceMemory]


class RunMemory(Result):
    """Memory across ranks: the highest peak and how far above the others' it is."""

    peak_mb: float
    peak_rank: int
    device: str  # the device of that peak
    # its peak less the median of the other ranks' (on the same kind of device), in MiB and as
    # a fraction of that median; null with one rank
    excess_mb: float | None
    imbalance: float | None
    median_mb: float | None  # the median of the other ranks' peaks (null with one rank)
    imbalanced: bool | None  # far above the others (a warning): the first to run out
    leaking_ranks: list[int] = []  # ranks whose main device's memory grows step after step
