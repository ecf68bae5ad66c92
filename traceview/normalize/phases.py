"""The ``positional_phases`` and ``host_phases`` passes: the phase of every host event, its own,
its nearest ancestor's, or its position's (the next phase marker after it on the training
thread).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traceview.model import schema as S
from traceview.model.columns import (
    HOST_TREE,
    STRUCTURAL,
)
from traceview.normalize.calltrees import CallTrees, Launched, RankColumns
from traceview.normalize.classify import KIND_CODES, NO_PHASE, PHASE_CODES, Classes
from traceview.normalize.steps import Steps

_STEP_END = len(S.EVENT_PHASES)  # pseudo-phase of a step's end, used as a positional anchor


# Phase markers that tell unclassified top-level operators where they stand: communication and
# "other" regions (zero_grad, often called between forward and backward) can sit anywhere.
ANCHOR_PHASES = np.array([p not in (S.COMM, S.OTHER) for p in S.EVENT_PHASES] + [True])


def positional_phases(
    classes: Classes,
    columns: RankColumns,
    steps: Steps,
    trees: CallTrees | None = None,
    launched: Launched | None = None,
    *,
    more_anchors: tuple[np.ndarray, np.ndarray] | None = None,
    backward_steps: np.ndarray | None = None,
) -> np.ndarray:
    """Pass ``positional_phases``: per event, the phase its position on the training thread gives
    it (``other`` where position says nothing).

    An operator with no phase of its own, at the top of the training thread, is forward when the
    next phase marker after it is forward or backward (or when its step has no backward at
    all), else other; which of them has a phase from above is for the next pass to decide.

    An operator whose device work (the activities launched from inside it, ``launched``) is
    host-to-device copies only is h2d whatever its position: ``x.to(device)`` right before the
    forward region is copying the batch, not running the model.

    A chunk of a rank (``traceview.ingest.large.chunked``) hands in what lies beyond it: ``more_anchors``
    (times and phase codes of phase markers outside its rows that are still the next marker of
    one of its candidates) and ``backward_steps`` (the steps of the whole rank that hold a
    backward event).

    The gradient seed is the exception: ``loss.backward()`` first makes
    the loss's gradient with ``ones_like``, outside any backward operator. When that is the
    last operator before a backward marker, it is backward: otherwise a gap between the loss
    and the seed (a rank descheduled as it enters backward) would be filled as forward.
    """
    kind, own, ts = classes.kind, classes.phase, columns.ts
    host_tree = HOST_TREE[kind]
    positional = np.full(len(kind), PHASE_CODES[S.OTHER], np.int8)
    candidates = np.flatnonzero(steps.on_training & (own < 0) & ~STRUCTURAL[kind])
    anchor = np.flatnonzero(host_tree & (own >= 0))
    anchor = anchor[ANCHOR_PHASES[own[anchor]]]
    extra_ts, extra_phase = more_anchors if more_anchors is not None else ([], [])
    anchor_ts = np.concatenate([ts[anchor], np.asarray(extra_ts, np.int64), steps.ends])
    anchor_phase = np.concatenate(
        [
            own[anchor].astype(np.int64),
            np.asarray(extra_phase, np.int64),
            np.full(len(steps.ends), _STEP_END),
        ]
    )
    order = np.argsort(anchor_ts, kind="stable")
    anchor_ts, anchor_phase = anchor_ts[order], np.append(anchor_phase[order], _STEP_END)
    next_phase = anchor_phase[np.searchsorted(anchor_ts, ts[candidates], side="right")]
    if backward_steps is None:
        backward_steps = np.unique(steps.step[host_tree & (own == PHASE_CODES[S.BACKWARD])])
    leads_to_compute = np.isin(next_phase, [PHASE_CODES[S.FORWARD], PHASE_CODES[S.BACKWARD]])
    forward = leads_to_compute | ~np.isin(steps.step[candidates], backward_steps)
    positional[candidates[forward]] = PHASE_CODES[S.FORWARD]
    seeds = _gradient_seeds(classes, columns, candidates, anchor_ts, next_phase)
    positional[seeds] = PHASE_CODES[S.BACKWARD]
    if trees is not None and launched is not None:
        copying = _copies_only(classes, trees, launched)
        positional[candidates[copying[candidates]]] = PHASE_CODES[S.H2D]
    return positional


def _copies_only(classes: Classes, trees: CallTrees, launched: Launched) -> np.ndarray:
    """Per event: a host event whose launched device work (its own and its descendants') is
    host-to-device copies only (a copy's own phase, from its rule, is h2d)."""
    n = len(classes.kind)
    has_copy = np.zeros(n, bool)
    has_other = np.zeros(n, bool)
    ok = launched.launcher >= 0
    rows, caller = launched.rows[ok], launched.launcher[ok]
    copy = classes.phase[rows] == PHASE_CODES[S.H2D]
    # walk each launch up its call tree, one level per pass, marking every ancestor
    while len(caller):
        has_copy[caller[copy]] = True
        has_other[caller[~copy]] = True
        up = trees.parent[caller]
        keep = up >= 0
        caller, copy = up[keep], copy[keep]
    return has_copy & ~has_other


_GRADIENT_SEED_OPS = ("ones_like",)  # torch.autograd.backward's seed (_make_grads)


def _gradient_seeds(
    classes: Classes,
    columns: RankColumns,
    candidates: np.ndarray,
    anchor_ts: np.ndarray,
    next_phase: np.ndarray,
) -> np.ndarray:
    """Candidates that are the gradient seed: a ``ones_like`` whose next marker is backward,
    with no other candidate starting between its end and that marker."""
    seed_codes = [i for i, op in enumerate(classes.ops) if op in _GRADIENT_SEED_OPS]
    if not seed_codes or len(candidates) == 0:
        return candidates[:0]
    ts, end = columns.ts[candidates], columns.ts[candidates] + columns.dur[candidates]
    is_seed = np.isin(classes.default_op[candidates], seed_codes) & (
        next_phase == PHASE_CODES[S.BACKWARD]
    )
    seeds = np.flatnonzero(is_seed)
    if len(seeds) == 0:
        return candidates[:0]
    order = np.argsort(ts, kind="stable")
    sorted_ts = ts[order]
    # the first candidate starting at or after the seed's end, and the marker each one leads to
    after = np.searchsorted(sorted_ts, end[seeds], side="left")
    marker = np.searchsorted(anchor_ts, ts[seeds], side="right")
    has_after = after < len(order)
    after_marker = np.searchsorted(
        anchor_ts, sorted_ts[np.minimum(after, len(order) - 1)], side="right"
    )
    last_before_marker = ~has_after | (after_marker != marker)
    return candidates[seeds[last_before_marker]]


@dataclass
class HostPhases:
    """Pass ``host_phases``: phase and operator names of host events, flowing down the trees."""

    phase: np.ndarray  # int8 phase code (-1: not decided here: device activities)
    top_op: np.ndarray  # int32: the outermost operator's canonical name (from a rule)
    near_op: np.ndarray  # int32: the nearest operator's name-derived op


def host_phases(classes: Classes, trees: CallTrees, positional: np.ndarray) -> HostPhases:
    """An event's own phase, else its parent's, else its position's; region markers and Python
    frames pass phases down but take none by position."""
    kind, own = classes.kind, classes.phase
    n = len(kind)
    structural = STRUCTURAL[kind]
    phase = np.full(n, NO_PHASE, np.int8)
    passed = np.full(n, NO_PHASE, np.int8)  # what an event hands down to its children
    top_op = np.full(n, -1, np.int32)
    near_op = np.full(n, -1, np.int32)
    is_op = kind == KIND_CODES[S.KIND_OP]
    is_step = kind == KIND_CODES[S.KIND_STEP]
    level_order, parent, depth = trees.by_depth, trees.parent, trees.depth
    level_bounds = np.searchsorted(depth[level_order], np.arange(int(depth.max(initial=0)) + 2))
    for level in range(len(level_bounds) - 1):
        rows = level_order[level_bounds[level] : level_bounds[level + 1]]
        if len(rows) == 0:
            continue
        up = parent[rows]
        has_up = up >= 0
        up = np.maximum(up, 0)
        # A step marker starts afresh: under `traceview collect` it opens inside the previous
        # step's optimizer region (the profiler is advanced from an optimizer hook).
        inherited = np.where(has_up & ~is_step[rows], passed[up], NO_PHASE)
        eff = np.where(own[rows] >= 0, own[rows], inherited)
        eff = np.where((eff < 0) & ~structural[rows], positional[rows], eff)
        phase[rows] = eff
        passed[rows] = np.where(structural[rows] & (own[rows] < 0), inherited, eff)
        parent_op = np.where(has_up, top_op[up], -1)
        top_op[rows] = np.where(
            parent_op >= 0, parent_op, np.where(is_op[rows], classes.rule_op[rows], -1)
        )
        near_op[rows] = np.where(
            is_op[rows], classes.default_op[rows], np.where(has_up, near_op[up], -1)
        )
    return HostPhases(phase, top_op, near_op)
