"""Steps for traces that mark none: core passes a parser asks for by name
(``ParsedTrace.infer_steps``, ``normalize.STEP_INFERENCE``), run by normalize's ``infer_steps``
pass only when the trace has no step markers of its own (no event of kind ``step``).

The parser only reads what the file says; the pass makes the markers, on a thread of their own
(``STEP_THREAD``, in the process of the first host event the pass uses), names that thread and
says in a remark where the steps came from. A marker is an event of kind ``step``, category
``traceview`` (the core's own), named ``<what> <number>``, that states its kind and number
(``schema.LAID_OUT_SCHEMA``, as the MXNet engine layout's events do: no rule reads them back
from the name); the core then treats it as any other step marker (design section 2, "The
training thread and the steps").

``step_groups``
    one step per step group: the id a profiler gives every event of one step without marking
    the step (TensorFlow's ``group_id``; raw column ``step_group``). The marker spans the group's
    host events, from the first start to the last end; it is numbered by the group id.
``session_runs``
    one step per TF1 ``Session.run``: the Timeline writes no step markers, but each run starts
    with the executor's ``_SOURCE`` node (an op named ``_SOURCE:NoOp`` on the CPU device, else on
    any device, kernels by their scope), so a step runs from one ``_SOURCE`` node to the next,
    the last to the trace's end. Numbered from 0 in time order.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import dictionary_codes, distinct, ints
from traceview.model.errors import Notes
from traceview.normalize.rules import MAX_STEP
from traceview.normalize.steps import InferredSteps

#: The thread (tid) that holds inferred step markers, in the process of the first host event the
#: pass uses (as the TensorFlow parsers had it): no parser puts an event of its own there
#: (tests/{unit,integration}/test_parser_contract.py checks every sample and shared trace).
STEP_THREAD = -2
#: The category of inferred markers: traceview's own, as the MXNet engine layout's spans.
CATEGORY = "traceview"


def _host(raw: pa.Table) -> np.ndarray:
    """Per event: whether it runs on the host (not a device activity or device annotation)."""
    codes, kinds = dictionary_codes(raw.column(S.KIND))
    on_device = (*S.DEVICE_ACTIVITY_KINDS, S.KIND_GPU_ANNOTATION)
    return np.array([k not in on_device for k in kinds] + [True], bool)[codes]


def _markers(
    pid: int, names: list[str], numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> pa.Table:
    """Step markers as events a layout pass made (``schema.LAID_OUT_SCHEMA``): they state their
    kind and step number, so no rule reads the number back from the name (a user's ``[step]``
    pattern applies to the trace's own markers)."""
    n = len(names)
    numbers = np.asarray(numbers, np.int64)
    known = (numbers >= 0) & (numbers < MAX_STEP)
    table = pa.table(
        {
            S.KIND: pa.array([S.KIND_STEP] * n, pa.string()).dictionary_encode(),
            S.CAT: pa.array([CATEGORY] * n, pa.string()).dictionary_encode(),
            S.NAME: pa.array(names, pa.string()).dictionary_encode(),
            S.PID: pa.array(np.full(n, pid, np.int64)),
            S.TID: pa.array(np.full(n, STEP_THREAD, np.int64)),
            S.TS_NS: pa.array(starts.astype(np.int64)),
            S.DUR_NS: pa.array(np.maximum(ends - starts, 0).astype(np.int64)),
            S.STATED_KIND: pa.array([S.KIND_STEP] * n, pa.string()).dictionary_encode(),
            S.STATED_PHASE: pa.array([None] * n, pa.string()).dictionary_encode(),
            S.STATED_OP: pa.array([None] * n, pa.string()).dictionary_encode(),
            S.STATED_STEP: pa.array(numbers, pa.int64(), mask=~known),
        }
    )
    return S.conform(table, S.LAID_OUT_SCHEMA)


def _nothing() -> InferredSteps:
    return InferredSteps(_markers(0, [], np.zeros(0), np.zeros(0), np.zeros(0)))


def _first_host_pid(raw: pa.Table, host: np.ndarray) -> int:
    rows = np.flatnonzero(host)
    pid = ints(raw.column(S.PID), 0)
    return int(pid[rows[0]]) if len(rows) else int(pid[0]) if len(pid) else 0


def from_step_groups(raw: pa.Table, process_names: dict[int, str], notes: Notes) -> InferredSteps:
    """One marker per step group, spanning the group's host events."""
    if S.STEP_GROUP not in raw.column_names or raw.column(S.STEP_GROUP).null_count == raw.num_rows:
        return _nothing()
    grouped = raw.column(S.STEP_GROUP).is_valid().to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(grouped & _host(raw))
    if len(rows) == 0:
        return _nothing()
    group = ints(raw.column(S.STEP_GROUP), 0)[rows]
    ts = ints(raw.column(S.TS_NS), 0)[rows]
    end = ts + np.maximum(ints(raw.column(S.DUR_NS), 0)[rows], 0)
    groups, inverse = np.unique(group, return_inverse=True)
    starts = np.full(len(groups), np.iinfo(np.int64).max, np.int64)
    ends = np.full(len(groups), np.iinfo(np.int64).min, np.int64)
    np.minimum.at(starts, inverse, ts)
    np.maximum.at(ends, inverse, end)
    pid = int(ints(raw.column(S.PID), 0)[rows[0]])
    notes.remark(
        "no step markers in the TensorFlow profile: steps are TensorFlow's own grouping of "
        "events into steps (group_id)"
    )
    markers = _markers(pid, [f"step {int(g)}" for g in groups], groups, starts, ends)
    return InferredSteps(markers, {f"{pid}/{STEP_THREAD}": "steps (TensorFlow's step groups)"})


SOURCE_NODE = "_SOURCE"


def _is_source(column: pa.ChunkedArray) -> np.ndarray:
    """Per event: whether the name (or scope) is a ``_SOURCE`` node (``_SOURCE:NoOp``)."""
    codes, values = dictionary_codes(column)
    source = [v is not None and str(v).partition(":")[0] == SOURCE_NODE for v in values]
    return np.array([*source, False], bool)[codes]


def from_session_runs(raw: pa.Table, process_names: dict[int, str], notes: Notes) -> InferredSteps:
    """A step per Session.run: from its ``_SOURCE`` node to the next one (the last: to the
    trace's end). A trace of one run is one step."""
    if raw.num_rows == 0:
        return _nothing()
    pid = ints(raw.column(S.PID), 0)
    ts = ints(raw.column(S.TS_NS), 0)
    named = _is_source(raw.column(S.NAME))
    cpu = np.array(sorted(p for p, name in process_names.items() if "cpu" in name.lower()))
    sources = named & np.isin(pid, cpu)
    if not sources.any():  # a GPU-only graph: every device's _SOURCE nodes, kernels by scope
        sources = named | _is_source(raw.column(S.SCOPE))
    starts = distinct(ts[sources])
    if len(starts) == 0:
        return _nothing()
    end = int((ts + np.maximum(ints(raw.column(S.DUR_NS), 0), 0)).max())
    bounds = np.append(starts, max(end, int(starts[-1])))
    step_pid = _first_host_pid(raw, _host(raw))
    if len(starts) > 1:
        notes.remark(
            "TensorFlow Timeline without step markers: steps start at each Session.run's _SOURCE "
            "node"
        )
    names = [f"Session.run {number}" for number in range(len(starts))]
    markers = _markers(step_pid, names, np.arange(len(starts)), bounds[:-1], bounds[1:])
    return InferredSteps(
        markers, {f"{step_pid}/{STEP_THREAD}": "steps (TensorFlow's Session.run calls)"}
    )
