"""The job's step time as a series (numpy only: `traceview watch` imports it without polars or
pyarrow): the running median, slow steps, level shifts (binary segmentation of the log step
time, spikes set to the running median first) and the rank whose own work moved with one, the
steps profile windows hold. Used by the whole run (whole_run.py) and the live look (live.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from traceview.model.results.live import StepChange

#: a step this many times the running median before it is a slow step
SLOW_FACTOR = 1.5
#: the steps the running median looks back over
RUNNING = 51
#: the slow steps named, at most (the slowest, in step order)
MAX_SLOW = 20
#: a rank is the slowest where its own work per step exceeds the median rank's by this share
#: of the job's step
SLOWEST_MARGIN = 0.02
#: a level shift: this relative change or more, segments of ``MIN_SEGMENT`` steps or more,
#: and a shift ``MIN_SCORE`` robust standard errors wide; at most ``MAX_CHANGES`` of them
MIN_SHIFT = 0.10
MIN_SEGMENT = 8
MIN_SCORE = 6.0
MAX_CHANGES = 8


#: a step is compared with the running median once this many steps are before it
HISTORY = 5
#: A profile window's steps: (window, the step its profile began in, its last recorded step)
Spans = Sequence[tuple[int, int, int]]
#: Each rank's own work per step: (its step numbers, in order; its own work, ms)
OwnByRank = Mapping[int, tuple[np.ndarray, np.ndarray]]


def _window_median(values: np.ndarray, before: int, after: int, least: int) -> np.ndarray:
    """Per value, the median of the values from ``before`` before it to ``after`` after it
    (itself where ``before`` is not 0 and... see the callers), NaN where fewer than ``least``
    are known."""
    n = len(values)
    width = before + after
    padded = np.concatenate([np.full(before, np.nan), values.astype(float), np.full(after, np.nan)])
    frames = sliding_window_view(padded, width + 1)[:n]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a frame of NaN only)
        found = np.nanmedian(frames, axis=1)
    found[np.sum(~np.isnan(frames), axis=1) < least] = np.nan
    return found


def running_median(values: np.ndarray, window: int = RUNNING) -> np.ndarray:
    """The median of the up-to ``window`` values before each one (NaN for the first
    ``HISTORY``)."""
    if not len(values):
        return np.empty(0)
    shifted = np.concatenate([[np.nan], values[:-1].astype(float)])
    return _window_median(shifted, window - 1, 0, HISTORY)


def centred_median(values: np.ndarray, window: int) -> np.ndarray:
    """The median of the ``window`` values around each one (fewer at the ends)."""
    if not len(values):
        return np.empty(0)
    return _window_median(values, window // 2, window // 2, 1)


def profiled(numbers: np.ndarray, windows: Spans) -> np.ndarray:
    """Which step numbers a profile window holds, warm-up included, and the step after its
    last (its trace is written as that one begins): -1 for none, else the window."""
    found = np.full(len(numbers), -1, np.int64)
    for window, began, last in windows:
        found[(numbers >= began) & (numbers <= last + 1)] = window
    return found


def slow_indices(ms: np.ndarray) -> np.ndarray:
    """The indices of the steps above ``SLOW_FACTOR`` times the running median before them."""
    before = running_median(ms)
    return np.flatnonzero(ms > SLOW_FACTOR * np.nan_to_num(before, nan=np.inf))


def step_changes(numbers: np.ndarray, ms: np.ndarray, own: OwnByRank) -> list[StepChange]:
    """The step time's level shifts, each with the rank whose own work moved most with it."""
    if len(ms) < 2 * MIN_SEGMENT:
        return []
    before = running_median(ms)
    level = np.where(ms > SLOW_FACTOR * np.nan_to_num(before, nan=np.inf), before, ms)
    series = np.log(np.maximum(level, 1e-6))
    # the noise: the steps' robust spread from one step to the next (a level shift is one jump)
    noise = 1.4826 * float(np.median(np.abs(np.diff(series)))) / math.sqrt(2)
    noise = max(noise, 1e-3)
    cuts = sorted(_segment(series, 0, len(series), noise, MAX_CHANGES))
    found = []
    bounds = [0, *cuts, len(series)]
    for i, cut in enumerate(cuts):
        left, right = level[bounds[i] : cut], level[cut : bounds[i + 2]]
        a, b = float(np.median(left)), float(np.median(right))
        if abs(b - a) < MIN_SHIFT * min(a, b):
            continue
        rank = moved_rank(own, numbers[bounds[i] : cut], numbers[cut : bounds[i + 2]], b > a)
        step = int(numbers[cut])
        if rank is not None:  # (its own work, without the others' noise, says where exactly)
            step = _sharpened(own[rank], step)
        found.append(
            StepChange(
                step=step, ms_before=rounded(a) or 0.0, ms_after=rounded(b) or 0.0, rank=rank
            )
        )
    return found


def _sharpened(own: tuple[np.ndarray, np.ndarray], step: int) -> int:
    """Where, within ``MIN_SEGMENT`` steps of ``step``, the rank's own work (``own``: its step
    numbers and own work) moves most between the ``MIN_SEGMENT`` steps before and after."""
    steps, values = own
    at = int(np.searchsorted(steps, step))
    lo, hi = at - MIN_SEGMENT, at + MIN_SEGMENT
    if lo < MIN_SEGMENT or hi + MIN_SEGMENT > len(values):
        return step
    sums = np.concatenate([[0.0], np.cumsum(values)])
    candidates = np.arange(lo, hi + 1)
    before = (sums[candidates] - sums[candidates - MIN_SEGMENT]) / MIN_SEGMENT
    after = (sums[candidates + MIN_SEGMENT] - sums[candidates]) / MIN_SEGMENT
    best = int(candidates[int(np.argmax(np.abs(after - before)))])
    return int(steps[best])


def _segment(series: np.ndarray, start: int, end: int, noise: float, budget: int) -> list[int]:
    """The cuts of ``series[start:end]``: its best split where it scores ``MIN_SCORE`` or more,
    then each side's own."""
    n = end - start
    if budget <= 0 or n < 2 * MIN_SEGMENT:
        return []
    part = series[start:end]
    sums = np.cumsum(part)
    k = np.arange(MIN_SEGMENT, n - MIN_SEGMENT + 1)
    left = sums[k - 1] / k
    right = (sums[-1] - sums[k - 1]) / (n - k)
    score = np.abs(right - left) * np.sqrt(k * (n - k) / n) / noise
    best = int(np.argmax(score))
    if score[best] < MIN_SCORE:
        return []
    cut = start + int(k[best])
    rest = budget - 1
    lower = _segment(series, start, cut, noise, rest // 2 + rest % 2)
    upper = _segment(series, cut, end, noise, rest // 2)
    return [*lower, cut, *upper]


def moved_rank(own: OwnByRank, before: np.ndarray, after: np.ndarray, rose: bool) -> int | None:
    """The rank whose own work per step (median) rose most from the steps ``before`` to those
    ``after`` (fell most, where the step time fell: ``rose`` False)."""
    best, best_rank = -np.inf, None
    for rank, (steps, values) in own.items():
        then, now = values[np.isin(steps, before)], values[np.isin(steps, after)]
        if not len(then) or not len(now):
            continue
        moved = float(np.median(now) - np.median(then))
        moved = moved if rose else -moved
        if moved > best:
            best, best_rank = moved, int(rank)
    return best_rank


def rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 3)
