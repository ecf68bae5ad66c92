"""The ``layout``, ``infer_steps`` and ``steps`` passes: a format's own layout (MXNet's engine
timeline), step markers inferred where a format says how, and the training thread's step
windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import (
    HOST_TREE,
    dictionary_codes,
    disjoint,
    outermost_operators,
    training_thread_of,
    window_index,
)
from traceview.model.errors import BadInput, Notes
from traceview.normalize.calltrees import CallTrees, RankColumns
from traceview.normalize.classify import KIND_CODES, PHASE_CODES, Classes
from traceview.normalize.rules import RuleSet

NO_STEP_MARKERS = (
    "no step markers (ProfilerStep#N) on the training thread and nothing found that repeats: "
    "the whole trace is analysed as one window with no step number, its one-time startup "
    "costs in it; no per-step advice is given"
)


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
    # how the steps were found (results.StepsFrom: "step_groups", "dataloader", ...; "": none)
    how: str = ""
    # the step numbers the trace itself calls warm-up (an annotation named so)
    warmup: list[int] = field(default_factory=list)


#: Step inference a parser can ask for (``ParsedTrace.infer_steps``): "module:function", imported
#: when used; each takes (raw, process names, notes) and returns InferredSteps.
STEP_INFERENCE = {
    "step_groups": "traceview.normalize.step_inference:from_step_groups",
    "session_runs": "traceview.normalize.step_inference:from_session_runs",
    "repeats": "traceview.normalize.step_inference:from_repeats",
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
    marker = np.flatnonzero(on_training & (kind == KIND_CODES[S.KIND_STEP]))
    marker = marker[np.argsort(c.ts[marker], kind="stable")]
    # Keep disjoint windows: a marker that starts inside the previous one is dropped.
    marker = marker[disjoint(c.ts[marker], c.ts[marker] + c.dur[marker])]
    numbers = classes.step_number(marker)
    numbers = np.where(numbers >= 0, numbers, np.arange(len(marker)))
    kept = first_of_each_step(numbers, notes)
    marker, numbers = marker[kept], numbers[kept]
    starts, ends = c.ts[marker], c.ts[marker] + c.dur[marker]
    if len(marker) == 0:
        notes.remark(NO_STEP_MARKERS)
        step = np.full(n, -1, np.int64)
    else:
        window = window_index(starts, ends, c.ts)
        step = np.where(window >= 0, numbers[np.maximum(window, 0)], -1)
    return Steps(training, marker, starts, ends, step, on_training)


def first_of_each_step(numbers: np.ndarray, notes: Notes) -> np.ndarray:
    """Which of a rank's step markers, in time order (``numbers``: their step numbers), are
    kept: each number's first. A later marker of a number already seen (a second window of
    another run, or windows numbered alike: one rank's step is one step) is set aside, named in
    one warning; its events are in no step."""
    _, first = np.unique(numbers, return_index=True)
    kept = np.zeros(len(numbers), bool)
    kept[first] = True
    if not kept.all():
        from traceview.parsers import number_ranges

        again = sorted(set(numbers[~kept].tolist()))
        notes.warn(
            f"step number(s) {number_ranges(again)} begin again later in the trace(s) (traces "
            "of two runs, or profiler windows numbered alike?): the first of each is counted, "
            f"the {int((~kept).sum())} later one(s) set aside"
        )
    return kept
