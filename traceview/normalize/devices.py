"""The ``link_devices`` and ``collectives`` passes: device activities take the phase, step and
operator of the host call that launched them; each event's collective named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import (
    dictionary_codes,
    kind_table,
)
from traceview.model.errors import Notes
from traceview.normalize.calltrees import CallTrees, Launched, launchers
from traceview.normalize.classify import PHASE_CODES, Classes, has_scope, scope_classes
from traceview.normalize.phases import HostPhases
from traceview.normalize.rules import RuleSet
from traceview.normalize.steps import Steps

ON_DEVICE = kind_table((*S.DEVICE_ACTIVITY_KINDS, S.KIND_GPU_ANNOTATION))


@dataclass
class DeviceLinks:
    """Pass ``link_devices``: each device activity, linked to the host call that launched it."""

    rows: np.ndarray  # event indices of device activities
    launcher: np.ndarray  # per row: the launching host event (-1: none found)
    phase: np.ndarray  # per row: int8 phase code
    op: np.ndarray  # per row: int32 op code (-1: name-derived)
    step: np.ndarray  # per row: step number (-1: none)


def link_devices(
    raw: pa.Table,
    rules: RuleSet,
    classes: Classes,
    trees: CallTrees,
    steps: Steps,
    host: HostPhases,
    notes: Notes,
    launched: Launched | None = None,
) -> DeviceLinks:
    """Kernels and copies take the phase, step and operator of the host call that launched them
    (``correlation``, else the operator's ``external_id``), or of the operator the trace names
    as their scope; a rule of their own beats both. ``classes.ops`` gains scope operators."""
    own = classes.phase
    launched = launched or launchers(raw, classes, trees)
    device, launcher = launched.rows, launched.launcher
    linked = launcher >= 0
    safe = np.maximum(launcher, 0)
    if len(device) and not linked.all() and not has_scope(raw):
        notes.remark(
            f"{int((~linked).sum())} of {len(device)} device activities have no launching host "
            "call in the trace; their phase is 'other' unless a rule names it"
        )
    scope_phase, scope_op = scope_classes(raw, device, rules, classes.ops)
    # The trace's own word on the operator (its scope) beats the runtime call that launched it.
    phase = np.where(
        own[device] >= 0,
        own[device],
        np.where(
            scope_phase >= 0,
            scope_phase,
            np.where(linked, host.phase[safe], PHASE_CODES[S.OTHER]),
        ),
    ).astype(np.int8)
    # A kernel is named after the operator that launched it: the outermost one with a canonical
    # name (aten::linear -> fully_connected), else the nearest one, else the runtime call.
    launcher_op = np.where(host.top_op[safe] >= 0, host.top_op[safe], host.near_op[safe])
    launcher_op = np.where(launcher_op >= 0, launcher_op, classes.default_op[safe])
    op = np.where(
        classes.rule_op[device] >= 0,
        classes.rule_op[device],
        np.where(scope_op >= 0, scope_op, np.where(linked, launcher_op, -1)),
    ).astype(np.int32)
    step = np.where(linked, steps.step[safe], steps.step[device])
    return DeviceLinks(device, launcher, phase, op, step)


@dataclass
class Collectives:
    """Pass ``collectives``: which collective each event is, and the op names that gives."""

    collective: np.ndarray  # int16 index into names (-1: none)
    names: list[str]
    op: np.ndarray  # int32 op code per event, after the collective names (into classes.ops)


def name_collectives(
    raw: pa.Table, rules: RuleSet, classes: Classes, op: np.ndarray
) -> Collectives:
    """A rule's collective, or the one the trace's argument names (NCCL's ``Collective name``)
    where the rule defers to it; an event named by its argument takes it as its op unless a rule
    gave it one."""
    names = list(classes.collectives)
    collective = classes.collective.copy()
    if not classes.from_args.any():
        return Collectives(collective, names, op)
    hint_codes, hints = dictionary_codes(raw.column(S.COLLECTIVE))
    if not hints:
        return Collectives(collective, names, op)
    op = op.copy()
    mapped = []
    for value in hints:
        name = rules.normalize_collective(value)
        if name is not None and name not in names:
            names.append(name)
        mapped.append(names.index(name) if name is not None else -1)
    from_hint = np.where(hint_codes >= 0, np.array([*mapped, -1])[hint_codes], -1)
    use = classes.from_args & (from_hint >= 0)
    collective[use] = from_hint[use]
    ops = classes.ops
    for c_index, c_name in enumerate(names):
        if c_name not in ops:
            ops.append(c_name)
        take = use & (from_hint == c_index) & (classes.rule_op < 0)
        op[take] = ops.index(c_name)
    return Collectives(collective, names, op)


def launched_collectives(
    named: Collectives, rows: np.ndarray, launcher: np.ndarray, parent: np.ndarray, ops: list[str]
) -> Collectives:
    """A collective kernel is the collective of the host call that launched it (the nearest
    collective among its launching call and that call's ancestors), where there is one: NCCL
    runs an all-to-all as SendRecv kernels and names a grouped launch after its first
    operation, so a kernel's name alone can say "send" for an all-to-all. A kernel no
    collective call launched keeps its name's collective (a SendRecv kernel is then
    point-to-point). ``ops`` gains the collective names it hands out as operators."""
    collective = named.collective
    mine = (collective[rows] >= 0) & (launcher >= 0)
    if not mine.any():
        return named
    rows, at = rows[mine], launcher[mine]
    found = np.full(len(rows), -1, np.int64)
    open_rows = np.arange(len(rows))
    while len(at):  # one step up the call trees per pass: as many passes as they are deep
        hit = collective[at] >= 0
        found[open_rows[hit]] = collective[at[hit]]
        open_rows, at = open_rows[~hit], parent[at[~hit]]
        keep = at >= 0
        open_rows, at = open_rows[keep], at[keep]
    take = found >= 0
    collective, op = collective.copy(), named.op.copy()
    collective[rows[take]] = found[take]
    for c_index in np.unique(found[take]):
        name = named.names[int(c_index)]
        if name not in ops:
            ops.append(name)
        op[rows[take & (found == c_index)]] = ops.index(name)
    return Collectives(collective, named.names, op)
