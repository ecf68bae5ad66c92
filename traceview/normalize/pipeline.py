"""From a parser's raw events to the ``events`` table: a chain of named passes (``PASSES``).

Everything here is vectorized over the whole rank (numpy), except the rules, which run once per
distinct (kind, category, name). Each pass is a function of the earlier passes' results that
returns its own (a small dataclass of per-event arrays) and never changes theirs; ``normalize``
runs them in order and assembles the table. ``tests/{unit,integration}/test_normalize_passes.py`` holds every pass
to its contract on every sample trace.

``kinds``
    an event whose parser left its kind open takes its category's (``kinds_from_categories``);
``layout``
    a format that needs it is laid out by a named pass (``LAYOUTS``: MXNet's engine timeline,
    ``traceview/normalize/mxnet_engine.py``);
``stray_times``
    events with corrupt times (30 days from the rest) are dropped, with a warning;
``infer_steps``
    a trace without step markers whose format says how its steps can be found gets markers from
    a named pass (``STEP_INFERENCE``: TensorFlow's step groups, TF1's ``Session.run`` calls;
    ``traceview/normalize/step_inference.py``);
``classify``
    rules give each distinct name its kind, own phase, canonical op and collective; the events
    a layout pass made are what it states they are (``schema.LAID_OUT_SCHEMA``);
``call_trees``
    host events nest per thread; depth, parent and self time come from sorting and binary
    searches, not from a per-event stack;
``steps``
    the training thread's step markers cut time into windows;
``positional_phases``
    an operator at the top of the training thread with no phase of its own is ``forward`` when
    the next phase marker after it (data loading, forward or backward region, optimizer, step
    end) is forward or backward, else ``other``; the gradient seed (``ones_like`` right before
    the first backward operator, made by ``loss.backward()``) is ``backward``;
    an operator whose device work is host-to-device copies only (``x.to(device)``) is ``h2d``;
``host_phases``
    an event without a phase of its own inherits its nearest ancestor's, else takes its
    position's; region markers and Python frames pass phases down but get none by position;
``link_devices``
    kernels and copies take the phase, step and operator of the host call that launched them
    (``correlation``, else the operator's ``external_id``), or of the operator the trace names
    as their ``scope`` (TensorFlow), unless a rule says otherwise (NCCL kernels are
    communication, host-to-device copies are h2d);
``collectives``
    the collective each event is, from a rule or the trace's own argument; a collective kernel
    is the collective of the host call that launched it, where one did (NCCL runs an all-to-all
    as SendRecv kernels): one name for it in every table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import (
    HOST_TREE,
    dictionary_array,
    outermost_operators,
    window_index,
)
from traceview.model.errors import Notes
from traceview.normalize.calltrees import CallTrees, RankColumns, call_trees, launchers
from traceview.normalize.classify import (
    PHASE_CODES,
    Classes,
    _constant,
    classify,
    kinds_from_categories,
    without_stray_times,
)
from traceview.normalize.devices import (
    ON_DEVICE,
    DeviceLinks,
    launched_collectives,
    link_devices,
    name_collectives,
)
from traceview.normalize.phases import HostPhases, host_phases, positional_phases
from traceview.normalize.rules import RuleSet
from traceview.normalize.steps import (
    InferredSteps,
    LayoutResult,
    Steps,
    find_steps,
    lay_out,
    step_markers,
    with_markers,
)


@dataclass
class RankMeta:
    run_id: str
    rank: int
    framework: str
    host: str | None = None
    source: str | None = None  # the trace's file name, for warnings


@dataclass
class Normalized:
    events: pa.Table  # schema.EVENTS_SCHEMA
    training_thread: tuple[int, int] | None
    steps: int  # number of step markers found on the training thread
    notes: Notes = field(default_factory=Notes)
    layout: LayoutResult | None = None  # what a layout pass found (its events dropped)
    inferred: InferredSteps | None = None  # what a step-inference pass made (its markers dropped)

    @property
    def steps_from(self) -> str:
        """Where the steps come from (results.StepsFrom)."""
        if self.steps == 0:
            return "one_window"
        if self.inferred is not None and self.inferred.how:
            return self.inferred.how
        return "markers"


#: The passes of ``normalize``, in the order they run; ``inspect`` sees each one's result.
def events_table(
    raw: pa.Table,
    rules: RuleSet,
    meta: RankMeta,
    classes: Classes,
    columns: RankColumns,
    trees: CallTrees,
    steps: Steps,
    host: HostPhases,
    devices: DeviceLinks,
    *,
    ids: np.ndarray | None = None,
    look: Inspector | None = None,
) -> pa.Table:
    """The passes' results merged into the ``events`` table (``schema.EVENTS_SCHEMA``), after
    the last pass, ``collectives``. Event ids are the rows' positions, or ``ids`` (a chunk's rows
    carry the rank's ids), and parent ids follow them."""
    n = raw.num_rows
    kind, own = classes.kind, classes.phase
    # Passes return fresh arrays and never change an earlier pass's result: copy, then merge.
    phase = host.phase.copy()
    phase[devices.rows] = devices.phase
    phase = np.where(phase < 0, np.where(own >= 0, own, PHASE_CODES[S.OTHER]), phase)
    step = steps.step.copy()
    step[devices.rows] = devices.step
    parent = trees.parent.astype(np.int64)  # a copy
    parent[devices.rows] = devices.launcher
    op = np.where(classes.rule_op >= 0, classes.rule_op, classes.default_op)
    op[devices.rows] = np.where(devices.op >= 0, devices.op, classes.default_op[devices.rows])
    named = name_collectives(raw, rules, classes, op)
    named = launched_collectives(
        named, devices.rows, devices.launcher, trees.parent.astype(np.int64), classes.ops
    )
    if look is not None:
        look("collectives", named)
    if ids is None:
        ids = np.arange(n, dtype=np.int64)
    else:
        parent = np.where(parent >= 0, ids[np.maximum(parent, 0)], -1)
    columns_out: dict[str, Any] = {
        S.RUN_ID: _constant(meta.run_id, n),
        S.RANK: pa.array(np.full(n, meta.rank, np.int32)),
        S.HOST: _constant(meta.host, n),
        S.FRAMEWORK: _constant(meta.framework, n),
        S.DEVICE: dictionary_array(ON_DEVICE[kind].astype(np.int8), [S.DEVICE_CPU, S.DEVICE_GPU]),
        S.KIND: dictionary_array(kind, list(S.EVENT_KINDS)),
        S.CAT: raw.column(S.CAT),
        S.PID: raw.column(S.PID),
        S.TID: raw.column(S.TID),
        S.NAME: raw.column(S.NAME),
        S.OP: dictionary_array(named.op, classes.ops),
        S.PHASE: dictionary_array(phase, list(S.EVENT_PHASES)),
        S.STEP: pa.array(step, pa.int64(), mask=step < 0),
        S.TS_NS: pa.array(columns.ts),
        S.DUR_NS: pa.array(columns.dur),
        S.SELF_NS: pa.array(trees.self_ns, pa.int64()),
        S.BYTES: raw.column(S.BYTES),
        S.COLLECTIVE: dictionary_array(named.collective, named.names),
        S.CORRELATION: raw.column(S.CORRELATION),
        S.EVENT_ID: pa.array(ids),
        S.PARENT: pa.array(parent, pa.int64(), mask=parent < 0),
        S.DEPTH: pa.array(trees.depth, pa.int32(), mask=trees.depth < 0),
        S.GROUP: raw.column(S.GROUP),
        S.PEER: raw.column(S.PEER),
        S.GRID: raw.column(S.GRID),
        S.BLOCK: raw.column(S.BLOCK),
        S.SPLIT_IMBALANCE: raw.column(S.SPLIT_IMBALANCE),
    }
    return S.conform(pa.table(columns_out), S.EVENTS_SCHEMA)


PASSES = (
    "kinds",
    "layout",
    "stray_times",
    "infer_steps",
    "classify",
    "call_trees",
    "steps",
    "positional_phases",
    "host_phases",
    "link_devices",
    "collectives",
)


Inspector = Callable[[str, Any], None]


def normalize(
    raw: pa.Table,
    rules: RuleSet,
    meta: RankMeta,
    *,
    layout: str | None = None,
    infer_steps: str | None = None,
    process_names: dict[int, str] | None = None,
    inspect: Inspector | None = None,
) -> Normalized:
    """Classify and structure one rank's raw events into the ``events`` table.

    ``inspect(pass name, result)`` is called after each pass (``PASSES``), for tests.
    """
    look: Inspector = inspect or (lambda name, result: None)
    notes = Notes()
    raw, found, inferred = whole_rank_passes(
        raw, rules, meta.rank, layout, infer_steps, process_names or {}, notes, look
    )
    classes = classify(raw, rules, notes, meta.source or f"rank {meta.rank}")
    look("classify", classes)
    columns = RankColumns.of(raw)
    trees = call_trees(classes, columns)
    look("call_trees", trees)
    steps = find_steps(classes, columns, trees, notes)
    look("steps", steps)
    launched = launchers(raw, classes, trees)
    positional = positional_phases(classes, columns, steps, trees, launched)
    look("positional_phases", positional)
    host = host_phases(classes, trees, positional)
    look("host_phases", host)
    devices = link_devices(raw, rules, classes, trees, steps, host, notes, launched)
    look("link_devices", devices)

    del positional, launched
    table = events_table(raw, rules, meta, classes, columns, trees, steps, host, devices, look=look)
    if found is not None:
        found.events = found.events.slice(0, 0)
    if inferred is not None:  # the markers are in the table now
        inferred = InferredSteps(
            inferred.markers.slice(0, 0), inferred.threads, inferred.how, inferred.warmup
        )
    return Normalized(table, steps.training, len(steps.markers), notes, found, inferred)


def whole_rank_passes(
    raw: pa.Table,
    rules: RuleSet,
    rank: int,
    layout: str | None,
    infer_steps: str | None,
    process_names: dict[int, str],
    notes: Notes,
    look: Inspector = lambda name, result: None,
) -> tuple[pa.Table, LayoutResult | None, InferredSteps | None]:
    """The passes before classification, which look at the whole rank: kinds from the
    categories, the layout pass the format names, the events with corrupt times dropped, and
    the steps inferred where the format says how and the trace marks none (``normalize``; a
    rank read in chunks runs them on a trace read whole: ``spill.WholeRankPasses``)."""
    raw = kinds_from_categories(raw, rules)
    look("kinds", raw)
    found: LayoutResult | None = None
    if layout is not None:
        found = lay_out(raw, rules, layout, process_names, notes)
        raw = found.events
    look("layout", found)
    raw = without_stray_times(raw, notes, rank)
    look("stray_times", raw)
    inferred: InferredSteps | None = None
    if infer_steps is not None:
        inferred = step_markers(raw, infer_steps, process_names, notes)
        raw = with_markers(raw, inferred)
    look("infer_steps", inferred)
    return raw, found, inferred


@dataclass
class ChunkContext:
    """What a chunk of a rank (``traceview.ingest.large.chunked``) needs to know of the whole rank: the
    training thread and every step window (the ``steps`` pass's result, found in one pass over
    the rank), the steps that hold a backward event, and the phase markers just past the chunk's
    end that may be the next marker of one of its operators (``positional_phases``)."""

    training: tuple[int, int]
    starts: np.ndarray  # ns, per kept step marker, by time
    ends: np.ndarray
    numbers: np.ndarray  # step number per window
    backward_steps: np.ndarray
    more_anchors: tuple[np.ndarray, np.ndarray]  # (ts, phase code)
    carried: int = 0  # the chunk's first rows are context carried from earlier chunks
    carried_positional: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))


@dataclass
class NormalizedChunk:
    """``normalize_chunk``'s result, per row of the chunk's input (carried context first)."""

    events: pa.Table  # schema.EVENTS_SCHEMA; event and parent ids are the rank's (``_row``)
    parent: np.ndarray  # row of the parent within the chunk (-1: none or not here)
    positional: np.ndarray  # int8, the positional phase (kept for rows carried onwards)
    host_tree: np.ndarray  # bool
    devices: int  # device activities among the chunk's own rows
    unlinked: int  # of those, how many have no launching host call here
    outermost: np.ndarray  # bool: an operator not nested in another (``training_thread_of``)
    own_backward: np.ndarray  # bool: its own phase (by name or rule) is backward


def normalize_chunk(
    raw: pa.Table, rules: RuleSet, meta: RankMeta, ctx: ChunkContext, notes: Notes
) -> NormalizedChunk:
    """``normalize`` on a chunk of whole steps of a rank, with what it needs of the rest of the
    rank in ``ctx``: the same passes, except ``steps`` (the rank's windows are handed in). The
    input is raw events with a ``_row`` column (each event's row in the whole rank, its id);
    its first ``ctx.carried`` rows are host events of earlier chunks still open when this one
    starts (and their ancestors), whose positional phases are the ones found in their own
    chunk. Self time is that of this chunk's children only: the caller adds up the rest."""
    raw = kinds_from_categories(raw, rules)
    classes = classify(raw, rules, notes, meta.source or f"rank {meta.rank}")
    columns = RankColumns.of(raw)
    trees = call_trees(classes, columns)
    kind = classes.kind
    host_tree = HOST_TREE[kind]
    on_training = (columns.pid == ctx.training[0]) & (columns.tid == ctx.training[1]) & host_tree
    window = window_index(ctx.starts, ctx.ends, columns.ts)
    step_of = np.full(len(window), -1, np.int64)
    step_of[window >= 0] = ctx.numbers[window[window >= 0]]
    steps = Steps(ctx.training, np.zeros(0, np.int64), ctx.starts, ctx.ends, step_of, on_training)
    launched = launchers(raw, classes, trees)
    positional = positional_phases(
        classes,
        columns,
        steps,
        trees,
        launched,
        more_anchors=ctx.more_anchors,
        backward_steps=ctx.backward_steps,
    )
    positional[: ctx.carried] = ctx.carried_positional
    host = host_phases(classes, trees, positional)
    devices = link_devices(raw, rules, classes, trees, steps, host, Notes(), launched)
    own_devices = devices.rows >= ctx.carried
    unlinked = int((devices.launcher[own_devices] < 0).sum())

    ids = np.asarray(raw.column("_row").to_numpy(zero_copy_only=False), np.int64)
    table = events_table(raw, rules, meta, classes, columns, trees, steps, host, devices, ids=ids)
    tree_parent = trees.parent.astype(np.int64)
    return NormalizedChunk(
        table,
        tree_parent,
        positional,
        host_tree,
        int(own_devices.sum()),
        unlinked,
        outermost_operators(kind, trees.parent),
        classes.phase == PHASE_CODES[S.BACKWARD],
    )
