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

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import dictionary_codes, distinct, ints, pair_groups
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
    return InferredSteps(S.empty(S.LAID_OUT_SCHEMA))  # (one table for every caller: ~0.2 ms)


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
    return InferredSteps(
        markers, {f"{pid}/{STEP_THREAD}": "steps (TensorFlow's step groups)"}, "step_groups"
    )


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
        markers,
        {f"{step_pid}/{STEP_THREAD}": "steps (TensorFlow's Session.run calls)"},
        "session_runs",
    )


#: The columns ``from_session_runs`` reads.
_SESSION_COLUMNS = (S.KIND, S.NAME, S.SCOPE, S.PID, S.TS_NS, S.DUR_NS)


@dataclass
class SessionRunState:
    """What ``from_session_runs`` needs of a rank read a batch at a time (its chunks), without
    holding the rank: its ``_SOURCE`` rows, its first host row (else its first row: the markers'
    process) and the row that ends last (the last step's end). ``table()`` is a raw table on
    which ``from_session_runs`` finds what it finds on the whole rank."""

    rows: list[pa.Table] = field(default_factory=list)
    first: pa.Table | None = None  # the first host row, else the first row
    first_is_host: bool = False
    last: pa.Table | None = None
    end: int = -(1 << 63)

    def add(self, raw: pa.Table) -> None:
        """Take a batch of raw events (kinds filled in by category)."""
        if raw.num_rows == 0:
            return
        columns = raw.select([c for c in _SESSION_COLUMNS if c in raw.column_names])
        source = _is_source(raw.column(S.NAME))
        if S.SCOPE in raw.column_names:
            source |= _is_source(raw.column(S.SCOPE))
        if source.any():
            self.rows.append(columns.filter(pa.array(source)))
        if not self.first_is_host:
            host = np.flatnonzero(_host(raw))
            # (rows taken, not sliced: a slice would hold the whole batch)
            if len(host):
                self.first, self.first_is_host = columns.take([int(host[0])]), True
            elif self.first is None:
                self.first = columns.take([0])
        ends = ints(raw.column(S.TS_NS), 0) + np.maximum(ints(raw.column(S.DUR_NS), 0), 0)
        last = int(np.argmax(ends))
        if ends[last] > self.end:
            self.end, self.last = int(ends[last]), columns.take([last])

    def then(self, later: SessionRunState) -> None:
        """Add the state of the rows that follow (a later part of the trace)."""
        self.rows.extend(later.rows)
        if not self.first_is_host and (later.first_is_host or self.first is None):
            self.first, self.first_is_host = later.first, later.first_is_host
        if later.end > self.end:
            self.end, self.last = later.end, later.last

    def table(self) -> pa.Table | None:
        """None: no ``_SOURCE`` node (nothing to cut steps at)."""
        if not self.rows:
            return None
        parts = [t for t in (self.first, *self.rows, self.last) if t is not None]
        tables = [S.conform(t, S.RAW_SCHEMA) for t in parts]
        return pa.concat_tables(tables).unify_dictionaries().combine_chunks()


# --- PyTorch traces without ProfilerStep markers: where the training loop repeats ------------

#: Categories of device activities and flows (not host calls a training loop makes).
_NOT_HOST = ("kernel", "gpu", "memcpy", "memset", "ac2g", "fwdbwd", "flow", "async", "trace")
#: Annotations that are not the user's step: the profiler's and the framework's own.
_NOT_A_STEP = ("ProfilerStep", "Optimizer.", "enumerate(DataLoader)", "DataLoader", "##")
#: PyTorch's own step markers (parsers/rules/pytorch.toml's step pattern): the trace has steps.
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
#: What tells one iteration's annotation from the next (PARAM's "...|warmup|forward" and
#: "...|measure|forward", numbered ones): left out where annotations are compared.
_ITERATION_TAG = re.compile(r"(?i)warm[-_ ]?up|measure(ment)?|timed|\d+")
#: An annotation that calls its iteration warm-up: that step is warm-up, whatever its time.
WARMUP_NAME = re.compile(r"(?i)warm[-_ ]?up")
#: A repeated annotation is a step only where its calls cover this share of their span.
ANNOTATION_COVER = 0.5


def _names(column: pa.ChunkedArray, test: object) -> np.ndarray:
    """Per event: whether its name passes ``test`` (evaluated once per distinct name)."""
    codes, values = dictionary_codes(column)
    assert callable(test)
    return np.array([v is not None and bool(test(str(v))) for v in values] + [False], bool)[codes]


def _host_calls(raw: pa.Table) -> np.ndarray:
    """Per event: a host call with a duration (its category not a device activity's or a
    flow's; its kind not stated as a device activity)."""
    codes, cats = dictionary_codes(raw.column(S.CAT))
    device = [c is not None and any(k in str(c).lower() for k in _NOT_HOST) for c in cats]
    host = ~np.array([*device, False], bool)[codes] & _host(raw)
    return host & (ints(raw.column(S.DUR_NS), 0) > 0)


def _one_thread(rows: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """The rows on the thread that holds most of them (the training loop's)."""
    if len(rows) == 0:
        return rows
    threads, inverse = pair_groups(pid[rows], tid[rows])
    best = int(np.argmax(np.bincount(inverse)))
    keep = (pid[rows] == threads[0, best]) & (tid[rows] == threads[1, best])
    return rows[keep]


def _disjoint_by_time(rows: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    rows = rows[np.argsort(ts[rows], kind="stable")]
    if len(rows) < 2:
        return rows
    latest = np.maximum.accumulate(end[rows])
    keep = np.concatenate(([True], ts[rows][1:] >= latest[:-1]))
    return rows[keep]


def _annotation_steps(
    raw: pa.Table, host: np.ndarray, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray,
    end: np.ndarray,
) -> np.ndarray | None:  # fmt: skip
    """The calls of the user annotation that repeats and covers most of its span (rows, by
    time), or None."""
    codes, cats = dictionary_codes(raw.column(S.CAT))
    user = np.array([c == "user_annotation" for c in cats] + [False], bool)[codes]
    user &= host & ~_names(raw.column(S.NAME), lambda n: n.startswith(_NOT_A_STEP))
    rows = np.flatnonzero(user)
    if len(rows) < 2:
        return None
    names, values = dictionary_codes(raw.column(S.NAME))
    # one annotation whatever its iteration's tag: "...|warmup|forward" and "...|measure|forward"
    keys = {code: _ITERATION_TAG.sub("", str(values[code])) for code in np.unique(names[rows])}
    key_of = np.array([hash(keys.get(c, "")) for c in range(len(values))] + [0], np.int64)[names]
    best: tuple[int, np.ndarray] | None = None
    for key in np.unique(key_of[rows]):
        calls = _disjoint_by_time(_one_thread(rows[key_of[rows] == key], pid, tid), ts, end)
        if len(calls) < 2:
            continue
        covered = int((end[calls] - ts[calls]).sum())
        span = int(end[calls].max() - ts[calls].min())
        if span > 0 and covered >= ANNOTATION_COVER * span and (best is None or covered > best[0]):
            best = (covered, calls)
    return best[1] if best is not None else None


def from_repeats(raw: pa.Table, process_names: dict[int, str], notes: Notes) -> InferredSteps:
    """Steps where a PyTorch trace without ``ProfilerStep`` markers repeats, the first found of:
    a user annotation that repeats (``record_function``: its calls are the steps); the data
    loader's ``__next__`` calls (a step from one to the next; the last to the end of the last
    optimizer step after it); the optimizer's ``step`` calls, or else the backward pass's roots
    (a step ends where one ends; the first starts at the loop's first call, so it holds
    whatever one-time work came before the first iteration: a leading outlier the report leaves
    out as warm-up). What comes before the first step is startup (CUDA context creation, first
    allocations, lazy initialization), outside every step. Nothing repeats: no markers (the
    trace is one window)."""
    if raw.num_rows == 0 or _names(raw.column(S.NAME), _PROFILER_STEP.match).any():
        return _nothing()  # the trace marks its steps (kinds are not classified yet)
    host = _host_calls(raw)
    pid, tid = ints(raw.column(S.PID), 0), ints(raw.column(S.TID), 0)
    ts = ints(raw.column(S.TS_NS), 0)
    end = ts + np.maximum(ints(raw.column(S.DUR_NS), 0), 0)
    name = raw.column(S.NAME)

    def calls(test: object) -> np.ndarray:
        rows = _one_thread(np.flatnonzero(host & _names(name, test)), pid, tid)
        return _disjoint_by_time(rows, ts, end)

    optimizer = calls(_optimizer_step)
    warmup: list[int] = []
    how, starts, ends, rows = "", np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, int)
    annotated = _annotation_steps(raw, host, pid, tid, ts, end)
    loader = calls(_loader_next)
    if annotated is not None:
        how, rows = "annotations", annotated
        starts, ends = ts[rows], end[rows]
        warmup = [i for i, r in enumerate(rows) if WARMUP_NAME.search(str(name[int(r)]))]
        what = f"the calls of the repeating annotation {str(name[int(rows[0])])[:80]!r}"
    elif len(loader) >= 2:
        how, rows = "dataloader", loader
        starts = ts[rows]
        thread = (pid == pid[rows[0]]) & (tid == tid[rows[0]]) & host
        last = int(end[thread].max())
        after = optimizer[ts[optimizer] >= starts[-1]] if len(optimizer) else optimizer
        last = int(end[after].max()) if len(after) else last
        ends = np.append(starts[1:], max(last, int(starts[-1])))
        if len(optimizer):  # only windows that hold an optimizer step (a last __next__ that
            # ends the epoch starts no iteration)
            held = np.array(
                [
                    ((ts[optimizer] >= s) & (end[optimizer] <= e)).any()
                    for s, e in zip(starts, ends, strict=True)
                ]
            )
            if held.any():
                starts, ends, rows = starts[held], ends[held], rows[held]
        what = "from one data-loader __next__ call to the next"
    else:
        backward = calls(_backward_call)
        for kind, found, said in (
            ("optimizer", optimizer, "an optimizer step"),
            ("backward", backward, "a backward pass"),
        ):
            if len(found) >= 2:
                # the first step: from the thread's first call that ends by the first boundary
                # (not a frame around the whole loop), startup and first iteration together
                thread = (pid == pid[found[0]]) & (tid == tid[found[0]]) & host
                before = thread & (end <= end[found[0]])
                first = int(ts[before].min()) if before.any() else int(ts[found[0]])
                how, rows = kind, found
                starts = np.append(first, end[found[:-1]])
                ends = end[found]
                what = (
                    f"each ends where {said} ends (the first from the loop's first call: "
                    "startup and the first iteration together)"
                )
                break
    if not how or len(starts) < 2:
        return _nothing()  # (the steps pass says the trace is one window)
    step_pid, step_tid = int(pid[rows[0]]), int(tid[rows[0]])
    notes.remark(f"no step markers (ProfilerStep#N): {len(starts)} steps inferred, {what}")
    numbers = np.arange(len(starts))
    markers = _markers(step_pid, [f"step {n}" for n in numbers], numbers, starts, ends)
    markers = markers.set_column(
        markers.schema.get_field_index(S.TID),
        S.TID,
        pa.array(np.full(len(starts), step_tid, np.int64)),
    )
    return InferredSteps(markers, how=how, warmup=warmup if len(warmup) < len(starts) else [])


def _optimizer_step(name: str) -> bool:
    return name.startswith("Optimizer.step#")


def _loader_next(name: str) -> bool:
    return "DataLoader" in name and "__next__" in name


def _backward_call(name: str) -> bool:
    return "run_backward" in name or ("torch/autograd/__init__.py" in name and "backward" in name)


def _repeat_name(name: str) -> bool:
    """A name ``from_repeats`` may cut steps at (its optimizer, data-loader and backward tests)."""
    return _optimizer_step(name) or _loader_next(name) or _backward_call(name)


#: The columns ``from_repeats`` reads.
_REPEAT_COLUMNS = (S.KIND, S.CAT, S.NAME, S.PID, S.TID, S.TS_NS, S.DUR_NS)


def _staircase(points: np.ndarray) -> np.ndarray:
    """Of host calls (rows pid, tid, start, end), per thread those no other call both ends by
    its end and starts before it (the least start among the calls that end by any time is one
    of theirs), and the one that ends last."""
    if points.shape[1] == 0:
        return points
    pid, tid, ts, end = points
    order = np.lexsort((ts, end, tid, pid))
    pid, tid, ts, end = pid[order], tid[order], ts[order], end[order]
    thread = np.concatenate(([True], (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])))
    # the least start so far in each thread (a running minimum per thread: threads are few)
    running = np.empty_like(ts)
    starts = np.flatnonzero(thread)
    for a, b in zip(starts, [*starts[1:], len(ts)], strict=True):
        running[a:b] = np.minimum.accumulate(ts[a:b])
    previous = np.concatenate(([np.iinfo(np.int64).max], running[:-1]))
    keep = thread | (ts < previous)
    last = np.concatenate((thread[1:], [True]))  # each thread's latest end
    keep |= last
    return np.stack([pid, tid, ts, end])[:, keep]


@dataclass
class RepeatState:
    """What ``from_repeats`` needs of a rank read a batch at a time (a large trace: its chunks),
    without holding the rank: the rows it could cut steps at, and per thread its host calls as a
    staircase (``_staircase``: what the first step's start and the loader's last end need).
    ``table()`` is a raw table on which ``from_repeats`` finds what it finds on the whole rank."""

    rows: list[pa.Table] = field(default_factory=list)
    points: np.ndarray = field(default_factory=lambda: np.zeros((4, 0), np.int64))
    pending: list[np.ndarray] = field(default_factory=list)

    def add(self, raw: pa.Table) -> None:
        """Take a batch of raw events (kinds filled in by category)."""
        if raw.num_rows == 0:
            return
        codes, cats = dictionary_codes(raw.column(S.CAT))
        user = np.array([c == "user_annotation" for c in cats] + [False], bool)[codes]
        keep = user | _names(raw.column(S.NAME), _repeat_name)
        if keep.any():
            self.rows.append(raw.select(list(_REPEAT_COLUMNS)).filter(pa.array(keep)))
        host = np.flatnonzero(_host_calls(raw))
        if len(host):
            ts = ints(raw.column(S.TS_NS), 0)[host]
            end = ts + ints(raw.column(S.DUR_NS), 0)[host]
            pid, tid = ints(raw.column(S.PID), 0)[host], ints(raw.column(S.TID), 0)[host]
            self.pending.append(_staircase(np.stack([pid, tid, ts, end])))
            if sum(p.shape[1] for p in self.pending) > 1 << 16:
                self._compact()

    def then(self, later: RepeatState) -> None:
        """Add the state of the rows that follow (a later part of the trace)."""
        self.rows.extend(later.rows)
        self.pending.extend([later.points, *later.pending])
        self._compact()

    def _compact(self) -> None:
        self.points = _staircase(np.concatenate([self.points, *self.pending], axis=1))
        self.pending = []

    def table(self) -> pa.Table:
        self._compact()
        pid, tid, ts, end = self.points
        n = len(ts)
        spans = pa.table(
            {
                S.KIND: pa.array([S.KIND_OP] * n, pa.string()).dictionary_encode(),
                S.CAT: pa.nulls(n, pa.string()).dictionary_encode(),
                S.NAME: pa.array([""] * n, pa.string()).dictionary_encode(),
                S.PID: pa.array(pid, pa.int64()),
                S.TID: pa.array(tid, pa.int64()),
                S.TS_NS: pa.array(ts, pa.int64()),
                S.DUR_NS: pa.array(end - ts, pa.int64()),
            }
        )
        parts = [S.conform(t, S.RAW_SCHEMA) for t in [*self.rows, spans]]
        return pa.concat_tables(parts).unify_dictionaries().combine_chunks()
