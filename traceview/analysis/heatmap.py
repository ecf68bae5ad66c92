"""The ranks × steps matrix of step time and of each phase, for the TUI's heatmap.

At 1,024 ranks and hundreds of steps a table of ranks hides which steps went wrong where; the
matrix shows both at once. Values are kept as flat ``array('d')`` (ranks × steps, row-major,
NaN where a rank has no such step), compact and readable without numpy by the views.
"""

from __future__ import annotations

import math
import warnings
from array import array
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traceview.model import schema as S

#: What the heatmap can show: the step's wall time, then each exclusive phase.
METRICS: tuple[str, ...] = ("step", *S.BREAKDOWN_PHASES)


@dataclass(frozen=True)
class StepMatrix:
    ranks: list[int]  # row order: by rank number
    steps: list[int | None]  # column order: by step number (None: an unnumbered window)
    values_ms: dict[str, array]  # metric -> ranks × steps, row-major; NaN: no such step
    low_ms: dict[str, float]  # metric -> its 5th percentile over the matrix (colour scale)
    high_ms: dict[str, float]  # and its 95th

    def value(self, metric: str, row: int, column: int) -> float:
        return self.values_ms[metric][row * len(self.steps) + column]


def step_matrix(steps: pa.Table) -> StepMatrix:
    """The matrix of every metric from a run's steps table (one row per rank and step)."""
    rank = steps.column(S.RANK).to_numpy(zero_copy_only=False).astype(np.int64)
    step_column = steps.column(S.STEP)
    numbered = step_column.null_count == 0
    step = (
        step_column.to_numpy(zero_copy_only=False).astype(np.int64)
        if numbered
        else np.zeros(len(steps), dtype=np.int64)  # one unnumbered window per rank
    )
    ranks, row = np.unique(rank, return_inverse=True)
    numbers, column = np.unique(step, return_inverse=True)
    values: dict[str, array] = {}
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for metric in METRICS:
        name = S.WALL_NS if metric == "step" else S.phase_ns(metric)
        grid = np.full((len(ranks), len(numbers)), np.nan)
        grid[row, column] = steps.column(name).to_numpy(zero_copy_only=False) / 1e6
        values[metric] = array("d", grid.ravel().tobytes())
        present = grid[~np.isnan(grid)]
        low[metric] = float(np.percentile(present, 5)) if present.size else 0.0
        high[metric] = float(np.percentile(present, 95)) if present.size else 0.0
    return StepMatrix(
        ranks=[int(r) for r in ranks],
        steps=[int(s) for s in numbers] if numbered else [None],
        values_ms=values,
        low_ms=low,
        high_ms=high,
    )


#: The rows a many-rank heatmap draws in place of every rank: percentiles over the ranks.
BANDS: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("max", 100.0))


def bands(matrix: StepMatrix, metric: str = "step") -> dict[str, list[float]]:
    """Per step, ``metric``'s percentiles over the ranks (BANDS; NaN: no rank has the step)."""
    grid = np.frombuffer(matrix.values_ms[metric], dtype=np.float64)
    grid = grid.reshape(len(matrix.ranks), len(matrix.steps))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a step no rank has: all NaN)
        return {name: np.nanpercentile(grid, q, axis=0).tolist() for name, q in BANDS}


def row_of(matrix: StepMatrix, rank: int, metric: str = "step") -> list[float]:
    """One rank's values over the steps (NaN where it has no such step)."""
    i, n = matrix.ranks.index(rank), len(matrix.steps)
    return matrix.values_ms[metric][i * n : (i + 1) * n].tolist()


def extremes(values: list[float]) -> tuple[float, float, float] | None:
    """The least, the median and the largest of ``values`` (NaN left out); None: none."""
    present = np.asarray(values, dtype=np.float64)
    present = present[~np.isnan(present)]
    if not present.size:
        return None
    return float(present.min()), float(np.median(present)), float(present.max())


def level(value: float, low: float, high: float, levels: int) -> int | None:
    """Which of ``levels`` colour steps ``value`` falls in between ``low`` and ``high``
    (clamped); None for a missing value."""
    if math.isnan(value):
        return None
    if high <= low:
        return 0
    return min(max(int((value - low) / (high - low) * levels), 0), levels - 1)
