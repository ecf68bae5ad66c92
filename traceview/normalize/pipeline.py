"""From a parser's raw events to the ``events`` table: a chain of named passes (``PASSES``).

Everything here is vectorized over the whole rank (numpy), except the rules, which run once per
distinct (kind, category, name). Each pass is a function of the earlier passes' results that
returns its own (a small dataclass of per-event arrays) and never changes theirs; ``normalize``
runs them in order and assembles the table. ``tests/test_normalize_passes.py`` holds every pass
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
    the collective each event is, from a rule or the trace's own argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    STRUCTURAL,
    dictionary_array,
    dictionary_codes,
    disjoint,
    ints,
    kind_table,
    outermost_operators,
    training_thread_of,
    unique_inverse,
    window_index,
)
from traceview.model.errors import BadInput, Notes
from traceview.normalize.rules import RuleSet

PHASE_CODES: dict[str, int] = {p: i for i, p in enumerate(S.EVENT_PHASES)}
NO_STEP_MARKERS = (
    "no step markers (ProfilerStep#N) on the training thread: the whole trace is "
    "analysed as one window with no step number"
)
NO_PHASE = -1
_STEP_END = len(S.EVENT_PHASES)  # pseudo-phase of a step's end, used as a positional anchor
_KIND_CODES: dict[str, int] = {k: i for i, k in enumerate(S.EVENT_KINDS)}
_ON_DEVICE = kind_table((*S.DEVICE_ACTIVITY_KINDS, S.KIND_GPU_ANNOTATION))
# Phase markers that tell unclassified top-level operators where they stand: communication and
# "other" regions (zero_grad, often called between forward and backward) can sit anywhere.
_ANCHOR_PHASES = np.array([p not in (S.COMM, S.OTHER) for p in S.EVENT_PHASES] + [True])


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


@dataclass
class Classes:
    """What the rules say, per event, in the smallest integer types that hold it."""

    kind: np.ndarray  # int8 kind code
    phase: np.ndarray  # int8 own phase code (NO_PHASE: context decides)
    rule_op: np.ndarray  # int32 index into ops (-1: no canonical op from a rule)
    default_op: np.ndarray  # int32 index into ops: the name-derived op
    collective: np.ndarray  # int16 index into collectives (-1: none)
    from_args: np.ndarray  # bool: collective comes from the trace's argument
    ops: list[str]
    collectives: list[str]
    _step: np.ndarray  # per distinct name: step number of step markers (-1: none)
    _inverse: np.ndarray
    _stated_step: np.ndarray | None = None  # per event: a layout pass's step number (-1: none)

    def step_number(self, rows: np.ndarray) -> np.ndarray:
        numbers = self._step[self._inverse[rows]]
        if self._stated_step is not None:
            stated = self._stated_step[rows]
            numbers = np.where(stated >= 0, stated, numbers)
        return numbers


@dataclass
class _Stated:
    """The events a layout pass made, and what it says they are (``schema.LAID_OUT_SCHEMA``)."""

    rows: np.ndarray  # event indices
    kind: np.ndarray  # per row: kind code
    phase: np.ndarray  # per row: phase code (NO_PHASE: none of its own)
    op: list[str | None]  # per row: canonical op (None: named after the event)
    step: np.ndarray  # per event (all of them): step number (-1: none)


def _stated(raw: pa.Table) -> _Stated | None:
    """What a layout pass stated of the events it made; None where it made none."""
    if S.STATED_KIND not in raw.column_names or raw.column(S.STATED_KIND).null_count == len(raw):
        return None
    kind, kinds = dictionary_codes(raw.column(S.STATED_KIND))
    rows = np.flatnonzero(kind >= 0)
    phase, phases = dictionary_codes(raw.column(S.STATED_PHASE))
    ops = raw.column(S.STATED_OP).take(pa.array(rows)).to_pylist()
    return _Stated(
        rows=rows,
        kind=np.array([_KIND_CODES[str(k)] for k in kinds], np.int8)[kind[rows]],
        phase=np.array([*(PHASE_CODES[str(p)] for p in phases), NO_PHASE], np.int8)[phase[rows]],
        op=[None if op is None else str(op) for op in ops],
        step=ints(raw.column(S.STATED_STEP), -1),
    )


def classify(raw: pa.Table, rules: RuleSet, notes: Notes | None = None, label: str = "") -> Classes:
    """The rules applied to each distinct (kind, category, name); a step marker whose number
    is too large to be a step is numbered by its position, with a warning in ``notes``. The
    events a layout pass made are what it states (``schema.STATED_KIND``...), not what a rule
    would make of their names."""
    stated = _stated(raw)
    kind_codes, kind_values = dictionary_codes(raw.column(S.KIND))
    cat_codes, cats = dictionary_codes(raw.column(S.CAT))
    key = kind_codes * (len(cats) + 1) + (cat_codes + 1)
    del kind_codes, cat_codes
    name_codes, name_values = dictionary_codes(raw.column(S.NAME))
    kinds = [str(k) for k in kind_values]
    names = [str(n) for n in name_values]
    key = key * max(len(names), 1) + name_codes
    del name_codes
    unique, inverse = unique_inverse(key)
    del key
    inverse = inverse.astype(np.int32)

    ops: dict[str, int] = {}
    collectives: dict[str, int] = {}
    count = len(unique)
    u_kind = np.empty(count, np.int8)
    u_phase = np.empty(count, np.int8)
    u_rule_op = np.empty(count, np.int32)
    u_default_op = np.empty(count, np.int32)
    u_collective = np.empty(count, np.int16)
    u_from_args = np.zeros(count, bool)
    u_step = np.full(count, -1, np.int64)
    by_rules = np.ones(count, bool)  # (kind, category, name)s of the trace's own events
    if stated is not None:
        trace_rows = np.ones(len(inverse), bool)
        trace_rows[stated.rows] = False
        by_rules[:] = False
        by_rules[inverse[trace_rows]] = True
    for i, value in enumerate(unique.tolist()):
        name_i = value % max(len(names), 1)
        rest = value // max(len(names), 1)
        cat = cats[rest % (len(cats) + 1) - 1] if rest % (len(cats) + 1) else None
        kind = kinds[rest // (len(cats) + 1)]
        name = names[name_i]
        if not by_rules[i]:  # only events a layout pass made: see below
            u_kind[i] = _KIND_CODES.get(kind, _KIND_CODES[S.KIND_OP])
            u_phase[i], u_rule_op[i], u_collective[i] = NO_PHASE, -1, -1
            u_default_op[i] = ops.setdefault(rules.default_op(name), len(ops))
            continue
        result = rules.classify(kind, cat, name)
        u_kind[i] = _KIND_CODES.get(result.kind, _KIND_CODES[S.KIND_OP])
        u_phase[i] = PHASE_CODES[result.phase] if result.phase else NO_PHASE
        u_rule_op[i] = ops.setdefault(result.op, len(ops)) if result.op else -1
        u_default_op[i] = ops.setdefault(rules.default_op(name), len(ops))
        u_collective[i] = (
            collectives.setdefault(result.collective, len(collectives)) if result.collective else -1
        )
        u_from_args[i] = result.collective_from_args
        if result.kind == S.KIND_STEP:
            number = rules.step_number(name)
            u_step[i] = -1 if number is None else number
            if number is None and notes is not None and rules.has_step_number(name):
                shown = repr(name) if len(name) <= 40 else repr(name[:37] + "...")
                notes.warn(
                    f"{label}: step marker {shown}: step number too large to be a step "
                    "(corrupt), numbered by its position"
                )
    classes = Classes(
        kind=u_kind[inverse],
        phase=u_phase[inverse],
        rule_op=u_rule_op[inverse],
        default_op=u_default_op[inverse],
        collective=u_collective[inverse],
        from_args=u_from_args[inverse],
        ops=list(ops),
        collectives=list(collectives),
        _step=u_step,
        _inverse=inverse,
    )
    if stated is not None:
        rows = stated.rows
        classes.kind[rows] = stated.kind
        classes.phase[rows] = stated.phase
        index = {op: i for i, op in enumerate(classes.ops)}
        for op in stated.op:
            if op is not None and op not in index:
                index[op] = len(classes.ops)
                classes.ops.append(op)
        classes.rule_op[rows] = [-1 if op is None else index[op] for op in stated.op]
        classes.collective[rows] = -1
        classes.from_args[rows] = False
        classes._stated_step = stated.step
    return classes


@dataclass
class _Tree:
    order: np.ndarray  # host event indices, sorted by thread then time
    depth: np.ndarray  # per host event (aligned with order)
    parent: np.ndarray  # position in order of the parent (-1: none)
    self_ns: np.ndarray


def _call_trees(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> _Tree:
    """Nesting of host events per thread, without a per-event loop.

    Sorted by (thread, start, zero-length first, longer first), the ancestors of event i are the
    earlier events of its thread that are still open when it starts, so its depth is
    ``i - (#earlier events of the thread that ended by then)``; its parent is the last earlier
    event one level up. Zero-length events never contain others.
    """
    n = len(ts)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return _Tree(empty, empty, empty, empty)
    order = np.lexsort((-dur, dur != 0, ts, tid, pid))
    p, t, s, d = pid[order], tid[order], ts[order], dur[order]
    new_thread = np.ones(n, bool)
    new_thread[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
    group = np.cumsum(new_thread) - 1
    t0 = int(s.min())
    span = int((s + d).max()) - t0 + 1
    if (int(group[-1]) + 1) * span >= 2**62:  # timestamps from different clocks, or garbage
        raise BadInput(
            f"the trace's events span {span / 3.156e16:,.0f} years on {int(group[-1]) + 1} "
            "threads: its timestamps are inconsistent, so events cannot be nested"
        )
    start_key = group * span + (s - t0)
    end_key = start_key + d
    del p, t, new_thread
    closed = np.searchsorted(np.sort(end_key), start_key, side="right")
    # Zero-length events that start with event i and sort after it have "ended" by its start
    # but are not before it; count them back (i itself included when it is zero-length).
    zero = d == 0
    index = np.arange(n)
    correction = np.zeros(n, np.int64)
    if zero.any():
        run_start = zero & np.concatenate(([True], (start_key[1:] != start_key[:-1]) | ~zero[:-1]))
        run_id = np.cumsum(run_start) - 1
        run_end = np.zeros(int(run_id.max()) + 1, np.int64)
        np.maximum.at(run_end, run_id[zero], index[zero] + 1)
        correction[zero] = run_end[run_id[zero]] - index[zero]
    depth = np.maximum(index - closed + correction, 0)
    del closed, correction, zero

    by_level = np.sort(depth * n + index)
    query = (depth - 1) * n + index
    pos = np.searchsorted(by_level, query, side="left") - 1
    candidate = np.where(pos >= 0, by_level[np.maximum(pos, 0)] % n, -1)
    ok = (depth > 0) & (pos >= 0)
    ok &= np.where(ok, by_level[np.maximum(pos, 0)] // n == depth - 1, False)
    ok &= np.where(ok, group[np.maximum(candidate, 0)] == group, False)
    parent = np.where(ok, candidate, -1)
    del by_level, query, pos, candidate, ok, index

    # Exact when events nest properly. A thread where some event outlives the one it started in
    # (Python frames against record_function regions, say) is walked with a stack instead.
    has_parent = parent >= 0
    outlives = has_parent & (end_key[np.maximum(parent, 0)] < end_key)
    for g in np.unique(group[outlives]):
        rows = np.flatnonzero(group == g)
        depth[rows], parent[rows] = _stack_walk(s[rows], (s + d)[rows], int(rows[0]))

    del start_key, end_key, group
    has_parent = parent >= 0
    child_ns = np.bincount(parent[has_parent], weights=d[has_parent], minlength=n)
    self_ns = np.maximum(d - child_ns.astype(np.int64), 0)
    return _Tree(order, depth.astype(np.int32), parent.astype(np.int32), self_ns)


def _stack_walk(start: np.ndarray, end: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent (positions + ``offset``) of one thread's events, sorted by start.

    The parent is the latest-started event still open; an event that ended under a longer-lived
    child stays on the stack until the child ends, as a profiler's own stack would have it.
    """
    depth = np.zeros(len(start), np.int64)
    parent = np.full(len(start), -1, np.int64)
    stack: list[int] = []
    ends = end.tolist()
    for i, t in enumerate(start.tolist()):
        while stack and ends[stack[-1]] <= t:
            stack.pop()
        depth[i] = len(stack)
        if stack:
            parent[i] = stack[-1] + offset
        stack.append(i)
    return depth, parent


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[j] for the j with keys[j] == query (first such j), -1 where none; keys >= 0."""
    valid = keys >= 0
    if not valid.any() or len(query) == 0:
        return np.full(len(query), -1, np.int64)
    k, v = keys[valid], values[valid]
    order = np.argsort(k, kind="stable")
    k, v = k[order], v[order]
    first = np.concatenate(([True], k[1:] != k[:-1]))
    k, v = k[first], v[first]
    pos = np.minimum(np.searchsorted(k, query), len(k) - 1)
    return np.where((query >= 0) & (k[pos] == query), v[pos], -1)


def has_scope(raw: pa.Table) -> bool:
    return S.SCOPE in raw.column_names and raw.column(S.SCOPE).null_count < raw.num_rows


def _scope_classes(
    raw: pa.Table, rows: np.ndarray, rules: RuleSet, ops: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Phase and op codes (-1: none) of ``rows`` as the operator named in their scope would get.

    ``ops`` gains the canonical names it did not have yet.
    """
    phase = np.full(len(rows), NO_PHASE, np.int8)
    op = np.full(len(rows), -1, np.int32)
    if not has_scope(raw) or len(rows) == 0:
        return phase, op
    scope, scopes = dictionary_codes(raw.column(S.SCOPE))
    codes = scope[rows]
    index = {name: i for i, name in enumerate(ops)}
    u_phase, u_op = [], []
    for name in scopes:
        result = rules.classify(S.KIND_OP, None, str(name))
        u_phase.append(PHASE_CODES[result.phase] if result.phase else NO_PHASE)
        canonical = result.op or rules.default_op(str(name))
        if canonical not in index:
            index[canonical] = len(ops)
            ops.append(canonical)
        u_op.append(index[canonical])
    known = codes >= 0
    phase[known] = np.array(u_phase, np.int8)[codes[known]]
    op[known] = np.array(u_op, np.int32)[codes[known]]
    return phase, op


def _constant(value: str | None, n: int) -> pa.DictionaryArray:
    if value is None:
        return pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], pa.string()))
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


#: No profiled window lasts this long: events this far from the rest carry a corrupt time.
STRAY_NS = 30 * 86_400 * 10**9


def _without_stray_times(raw: pa.Table, notes: Notes, rank: int) -> pa.Table:
    """The events, less those more than 30 days from the trace's median time (or lasting
    longer): one corrupt record must not make the whole trace unreadable."""
    if raw.num_rows == 0:
        return raw
    ts = ints(raw.column(S.TS_NS), 0)
    dur = ints(raw.column(S.DUR_NS), 0)
    if int(ts.max()) - int(ts.min()) <= STRAY_NS and int(dur.max()) <= STRAY_NS:
        return raw  # the usual case: no copies, no median
    ts_f = ts.astype(np.float64)
    stray = (np.abs(ts_f - np.median(ts_f)) > STRAY_NS) | (dur > STRAY_NS)
    if not stray.any():
        return raw
    notes.warn(
        f"rank {rank}: {int(stray.sum())} event(s) more than 30 days away from the rest of its trace "
        "(or lasting longer) were not read: their times are corrupt"
    )
    return raw.filter(pa.array(~stray))


def kinds_from_categories(raw: pa.Table, rules: RuleSet) -> pa.Table:
    """An event whose parser left its kind open takes the kind the rules give its category."""
    if raw.column(S.KIND).null_count == 0:
        return raw
    kind_codes, kinds = dictionary_codes(raw.column(S.KIND))
    cat_codes, cats = dictionary_codes(raw.column(S.CAT))
    stated = [str(k) for k in kinds]
    by_category = [rules.kind_of(c) for c in cats] + [rules.kind_of(None)]
    names = sorted({*stated, *by_category})
    code = {name: i for i, name in enumerate(names)}
    # on dictionary codes: the parser's kind where it stated one, else its category's
    from_category = np.array([code[k] for k in by_category], np.int32)[cat_codes]
    from_parser = np.array([code[k] for k in stated] + [0], np.int32)[kind_codes]
    filled = np.where(kind_codes >= 0, from_parser, from_category).astype(np.int32)
    column = pa.DictionaryArray.from_arrays(pa.array(filled), pa.array(names, pa.string()))
    return raw.set_column(raw.schema.get_field_index(S.KIND), S.KIND, column)


@dataclass
class LayoutResult:
    """What a layout pass returns: the laid-out raw events, and for the manifest what it found
    (added to the rank's meta, thread names and skipped-record counts)."""

    events: pa.Table  # schema.LAID_OUT_SCHEMA
    meta: dict[str, Any] = field(default_factory=dict)
    threads: dict[str, str] = field(default_factory=dict)  # "pid/tid" -> label
    skipped: dict[str, int] = field(default_factory=dict)


#: Layout passes a parser can ask for (``ParsedTrace.layout``): "module:function", imported
#: when used; each takes (raw, rules, process names, notes) and returns a LayoutResult.
LAYOUTS = {"mxnet_engine": "traceview.normalize.mxnet_engine:lay_out"}


def lay_out(
    raw: pa.Table, rules: RuleSet, layout: str, process_names: dict[int, str], notes: Notes
) -> LayoutResult:
    import importlib

    if layout not in LAYOUTS:
        raise BadInput(f"the parser asks for an unknown layout {layout!r}")
    module, _, function = LAYOUTS[layout].partition(":")
    result: LayoutResult = getattr(importlib.import_module(module), function)(
        raw, rules, process_names, notes
    )
    return result


@dataclass
class InferredSteps:
    """What a step-inference pass returns: step markers for a trace that has none (raw events
    of kind ``step``, appended after the trace's own; none where the pass found nothing to cut
    steps at), and labels of the threads they are on (for the manifest)."""

    markers: pa.Table  # schema.RAW_SCHEMA
    threads: dict[str, str] = field(default_factory=dict)  # "pid/tid" -> label


#: Step inference a parser can ask for (``ParsedTrace.infer_steps``): "module:function", imported
#: when used; each takes (raw, process names, notes) and returns InferredSteps.
STEP_INFERENCE = {
    "step_groups": "traceview.normalize.step_inference:from_step_groups",
    "session_runs": "traceview.normalize.step_inference:from_session_runs",
}


def step_markers(
    raw: pa.Table, method: str, process_names: dict[int, str], notes: Notes
) -> InferredSteps | None:
    """Markers from the named pass, for a trace with no event of kind ``step`` (None where the
    trace has its own)."""
    import importlib

    if method not in STEP_INFERENCE:
        raise BadInput(f"the parser asks for an unknown step inference {method!r}")
    kinds, values = dictionary_codes(raw.column(S.KIND))
    if S.KIND_STEP in values and (kinds == values.index(S.KIND_STEP)).any():
        return None
    module, _, function = STEP_INFERENCE[method].partition(":")
    result: InferredSteps = getattr(importlib.import_module(module), function)(
        raw, process_names, notes
    )
    return result


def with_markers(raw: pa.Table, inferred: InferredSteps | None) -> pa.Table:
    """The raw events and, after them, the inferred markers (one chunk, dictionaries unified)."""
    if inferred is None or inferred.markers.num_rows == 0:
        return raw
    schema = S.LAID_OUT_SCHEMA  # the markers state what they are
    both = pa.concat_tables([S.conform(raw, schema), S.conform(inferred.markers, schema)])
    return both.unify_dictionaries().combine_chunks()


@dataclass
class RankColumns:
    """The raw columns every pass reads, as numpy (times in ns; missing ids as 0)."""

    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    dur: np.ndarray  # never negative

    @classmethod
    def of(cls, raw: pa.Table) -> RankColumns:
        return cls(
            pid=ints(raw.column(S.PID), 0),
            tid=ints(raw.column(S.TID), 0),
            ts=ints(raw.column(S.TS_NS), 0),
            dur=np.maximum(ints(raw.column(S.DUR_NS), 0), 0),
        )


@dataclass
class CallTrees:
    """Pass ``call_trees``: how host events nest, per event (-1 where an event is not on a host
    thread's tree)."""

    depth: np.ndarray  # int32
    parent: np.ndarray  # int32 event index
    self_ns: np.ndarray  # duration less the children's (device activities: their duration)
    hosts: np.ndarray  # event indices of host-tree events, by thread then start
    by_depth: np.ndarray  # the same events, shallowest first (the order phases flow down in)


def call_trees(classes: Classes, columns: RankColumns) -> CallTrees:
    n = len(classes.kind)
    host_tree = HOST_TREE[classes.kind]
    host_idx = np.flatnonzero(host_tree)
    c = columns
    tree = _call_trees(c.pid[host_idx], c.tid[host_idx], c.ts[host_idx], c.dur[host_idx])
    hosts = host_idx[tree.order]
    depth = np.full(n, -1, np.int32)
    depth[hosts] = tree.depth
    parent = np.full(n, -1, np.int32)
    parent[hosts] = np.where(tree.parent >= 0, hosts[np.maximum(tree.parent, 0)], -1)
    self_ns = np.where(host_tree, 0, c.dur)
    self_ns[hosts] = tree.self_ns
    by_depth = hosts[np.argsort(tree.depth, kind="stable")]
    return CallTrees(depth, parent, self_ns, hosts, by_depth)


@dataclass
class Steps:
    """Pass ``steps``: the training thread and the step windows its markers open."""

    training: tuple[int, int] | None  # (pid, tid)
    markers: np.ndarray  # event indices of the kept step markers, by time
    starts: np.ndarray  # ns, per kept marker
    ends: np.ndarray
    step: np.ndarray  # per event: the step number of the window holding its start (-1: none)
    on_training: np.ndarray  # per event: a host event on the training thread


def find_steps(classes: Classes, columns: RankColumns, trees: CallTrees, notes: Notes) -> Steps:
    kind, hosts = classes.kind, trees.hosts
    c = columns
    n = len(kind)
    top = outermost_operators(kind, trees.parent)
    training = training_thread_of(
        c.pid[hosts], c.tid[hosts], kind[hosts], top[hosts], c.dur[hosts],
        classes.phase[hosts] == PHASE_CODES[S.BACKWARD],
    )  # fmt: skip
    del top
    on_training = np.zeros(n, bool)
    if training is not None:
        on_training = (c.pid == training[0]) & (c.tid == training[1]) & HOST_TREE[kind]
    marker = np.flatnonzero(on_training & (kind == _KIND_CODES[S.KIND_STEP]))
    marker = marker[np.argsort(c.ts[marker], kind="stable")]
    # Keep disjoint windows: a marker that starts inside the previous one is dropped.
    marker = marker[disjoint(c.ts[marker], c.ts[marker] + c.dur[marker])]
    starts, ends = c.ts[marker], c.ts[marker] + c.dur[marker]
    numbers = classes.step_number(marker)
    numbers = np.where(numbers >= 0, numbers, np.arange(len(marker)))
    if len(marker) == 0:
        notes.remark(NO_STEP_MARKERS)
        step = np.full(n, -1, np.int64)
    else:
        window = window_index(starts, ends, c.ts)
        step = np.where(window >= 0, numbers[np.maximum(window, 0)], -1)
    return Steps(training, marker, starts, ends, step, on_training)


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
    anchor = anchor[_ANCHOR_PHASES[own[anchor]]]
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
    is_op = kind == _KIND_CODES[S.KIND_OP]
    is_step = kind == _KIND_CODES[S.KIND_STEP]
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


@dataclass
class Launched:
    """Each device activity and the host call that launched it (``correlation``, else the
    operator's ``external_id``; -1: none found)."""

    rows: np.ndarray  # event indices of device activities
    launcher: np.ndarray  # per row: the launching host event (-1: none)


def launchers(raw: pa.Table, classes: Classes, trees: CallTrees) -> Launched:
    """The host call of each device activity: the runtime call with its ``correlation``, else
    the operator with its ``external_id``."""
    kind, hosts = classes.kind, trees.hosts
    device = np.flatnonzero(DEVICE[kind])
    correlation = ints(raw.column(S.CORRELATION), -1)
    external = ints(raw.column(S.EXTERNAL_ID), -1)
    runtime = hosts[kind[hosts] == _KIND_CODES[S.KIND_RUNTIME]]
    launcher = _lookup(correlation[runtime], runtime, correlation[device])
    host_ops = hosts[kind[hosts] != _KIND_CODES[S.KIND_RUNTIME]]
    by_external = _lookup(external[host_ops], host_ops, external[device])
    return Launched(device, np.where(launcher >= 0, launcher, by_external))


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
    scope_phase, scope_op = _scope_classes(raw, device, rules, classes.ops)
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
        S.DEVICE: dictionary_array(_ON_DEVICE[kind].astype(np.int8), [S.DEVICE_CPU, S.DEVICE_GPU]),
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
    raw = kinds_from_categories(raw, rules)
    look("kinds", raw)
    found: LayoutResult | None = None
    if layout is not None:
        found = lay_out(raw, rules, layout, process_names or {}, notes)
        raw = found.events
    look("layout", found)
    raw = _without_stray_times(raw, notes, meta.rank)
    look("stray_times", raw)
    inferred: InferredSteps | None = None
    if infer_steps is not None:
        inferred = step_markers(raw, infer_steps, process_names or {}, notes)
        raw = with_markers(raw, inferred)
    look("infer_steps", inferred)
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
        inferred = InferredSteps(inferred.markers.slice(0, 0), inferred.threads)
    return Normalized(table, steps.training, len(steps.markers), notes, found, inferred)


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
