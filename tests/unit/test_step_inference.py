"""Steps for traces that mark none, made by the core's step-inference passes
(traceview/normalize/step_inference.py) from what the parsers read: TensorFlow's step groups (the raw
``step_group`` column) and TF1 Timeline's ``_SOURCE`` nodes. Expected values come from hand-built
traces, from the trace files read another way (xprof's ProfileData, the Timeline's JSON), never
from the passes' own output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from traceview.model import schema as S
from traceview.model.errors import BadInput, Notes
from traceview.normalize.pipeline import Normalized, RankMeta, normalize
from traceview.normalize.rules import rules_for
from traceview.normalize.step_inference import STEP_THREAD, RepeatState
from traceview.normalize.steps import STEP_INFERENCE, step_markers

CPU = "/job:localhost/replica:0/task:0/device:CPU:0 Compute"
GPU = "/job:localhost/replica:0/task:0/device:GPU:0 Compute"


def _raw(rows: list[dict[str, Any]]) -> pa.Table:
    keys = {key for row in rows for key in row}  # from_pylist reads the first row's keys only
    return S.conform(
        pa.table({k: [row.get(k) for row in rows] for k in sorted(keys)}), S.RAW_SCHEMA
    )


def _event(cat: str, name: str, ts: int, dur: int, **extra: Any) -> dict[str, Any]:
    return {S.CAT: cat, S.NAME: name, S.PID: 1, S.TID: 5, S.TS_NS: ts, S.DUR_NS: dur, **extra}


def _normalize(raw: pa.Table, method: str, names: dict[int, str] | None = None) -> Normalized:
    return normalize(
        raw,
        rules_for("tensorflow"),
        RankMeta("run", 0, "tensorflow"),
        infer_steps=method,
        process_names=names or {},
    )


def _markers(normalized: Normalized) -> list[tuple[int | None, int, int, int, int]]:
    """(step, pid, tid, start, end) of every step marker, by start."""
    events = normalized.events
    kind = np.asarray(events.column(S.KIND).cast(pa.string()).to_pylist())
    rows = np.flatnonzero(kind == S.KIND_STEP)
    out = []
    for i in rows.tolist():
        ts, dur = events.column(S.TS_NS)[i].as_py(), events.column(S.DUR_NS)[i].as_py()
        pid, tid = events.column(S.PID)[i].as_py(), events.column(S.TID)[i].as_py()
        out.append((events.column(S.STEP)[i].as_py(), pid, tid, ts, ts + dur))
    return sorted(out, key=lambda m: m[3])


# --- step groups (TensorFlow 2 XSpace) ----------------------------------------------------------

GROUPED = [
    _event("tf_op", "model/dense/MatMul:MatMul", 100, 50, **{S.STEP_GROUP: 7}),
    _event("tf_host", "ExecutorState::Process", 90, 360, **{S.STEP_GROUP: 7}),
    _event("tf_op", "model/dense/BiasAdd:BiasAdd", 500, 100, **{S.STEP_GROUP: 9}),
    _event("tf_data", "Iterator::Range", 800, 100, **{S.STEP_GROUP: 9}),
    # a kernel of group 7 that runs late on the device: host events alone bound the step
    _event("tf_kernel", "volta_sgemm", 440, 300, **{S.STEP_GROUP: 7, S.PID: 3, S.TID: 1}),
    _event("tf_host", "no group", 1000, 10),
]


def test_one_marker_per_step_group_spanning_its_host_events() -> None:
    normalized = _normalize(_raw(GROUPED), "step_groups")
    # group 7: host events 90..450; group 9: 500..900 (the kernel and the ungrouped event: no)
    assert _markers(normalized) == [(7, 1, STEP_THREAD, 90, 450), (9, 1, STEP_THREAD, 500, 900)]
    assert normalized.steps == 2
    assert normalized.training_thread == (1, STEP_THREAD)
    events = normalized.events
    names, numbers = events.column(S.NAME).to_pylist(), events.column(S.STEP).to_pylist()
    steps = dict(zip(names, numbers, strict=True))
    assert steps["model/dense/MatMul:MatMul"] == 7 and steps["Iterator::Range"] == 9
    assert steps["no group"] is None  # after the last step
    assert any(
        "TensorFlow's own grouping of events into steps" in r for r in normalized.notes.remarks
    )
    assert normalized.inferred is not None
    assert normalized.inferred.threads == {f"1/{STEP_THREAD}": "steps (TensorFlow's step groups)"}


def test_a_user_step_pattern_keeps_the_inferred_steps(tmp_path: Path) -> None:
    """The inferred markers state their step number: a --rules file whose [step] pattern is for
    markers of the user's own (it would read no number from "step 7") keeps them as they are."""
    extra = tmp_path / "steps.toml"
    extra.write_text("[step]\npattern = '^iteration (\\d+)$'\n")
    normalized = normalize(
        _raw(GROUPED),
        rules_for("tensorflow", extra),
        RankMeta("run", 0, "tensorflow"),
        infer_steps="step_groups",
    )
    assert _markers(normalized) == [(7, 1, STEP_THREAD, 90, 450), (9, 1, STEP_THREAD, 500, 900)]
    assert normalized.steps == 2


def test_a_trace_with_step_markers_of_its_own_gets_none_inferred() -> None:
    marked = [*GROUPED, _event("tf_step", "train 3", 80, 900, **{S.TID: 6})]
    normalized = _normalize(_raw(marked), "step_groups")
    assert _markers(normalized) == [(3, 1, 6, 80, 980)]
    assert normalized.inferred is None
    assert not any("grouping of events" in r for r in normalized.notes.remarks)


def test_no_step_groups_no_markers() -> None:
    raw = _raw([_event("tf_op", "a:MatMul", 0, 10), _event("tf_op", "b:MatMul", 20, 10)])
    normalized = _normalize(raw, "step_groups")
    assert _markers(normalized) == [] and normalized.steps == 0
    assert any("no step markers" in r for r in normalized.notes.remarks)  # one window


def test_an_unknown_step_inference_is_bad_input() -> None:
    with pytest.raises(BadInput, match="unknown step inference 'per_epoch'"):
        step_markers(_raw(GROUPED), "per_epoch", {}, Notes())
    assert set(STEP_INFERENCE) == {"step_groups", "session_runs", "repeats"}


# --- Session.run calls (TF1 Timeline) ------------------------------------------------------------


def _runs(cpu_source: bool = True) -> pa.Table:
    rows = [
        _event("tf_op", "_SOURCE:NoOp", 1000, 5, **{S.PID: 2}),  # on the GPU device
        _event("tf_op", "dense/MatMul:MatMul", 1010, 100, **{S.PID: 1}),
        _event("tf_kernel", "MatMul", 1050, 200, **{S.PID: 3, S.SCOPE: "dense/MatMul:MatMul"}),
        _event("tf_kernel", "NoOp", 2005, 1, **{S.PID: 3, S.SCOPE: "_SOURCE:NoOp"}),
        _event("tf_op", "dense/MatMul:MatMul", 2010, 100, **{S.PID: 1}),
        _event("tf_op", "dense/MatMul:MatMul", 3010, 700, **{S.PID: 1}),
    ]
    if cpu_source:
        rows += [
            _event("tf_op", "_SOURCE:NoOp", 1002, 3, **{S.PID: 1}),
            _event("tf_op", "_SOURCE:NoOp", 2000, 3, **{S.PID: 1}),
            _event("tf_op", "_SOURCE:NoOp", 3000, 3, **{S.PID: 1}),
        ]
    return _raw(rows)


def test_a_step_per_session_run_from_the_cpu_source_nodes() -> None:
    normalized = _normalize(_runs(), "session_runs", {1: CPU, 2: GPU, 3: "/gpu:0/stream:7 Compute"})
    # the CPU device's _SOURCE nodes at 1002, 2000, 3000; the last step ends with the trace, 3710.
    # The markers go with the trace's first host event's process (pid 2 here).
    assert _markers(normalized) == [
        (0, 2, STEP_THREAD, 1002, 2000),
        (1, 2, STEP_THREAD, 2000, 3000),
        (2, 2, STEP_THREAD, 3000, 3710),
    ]
    assert any("each Session.run's _SOURCE node" in r for r in normalized.notes.remarks)


def test_a_gpu_only_graph_takes_every_device_source_node_kernels_by_scope() -> None:
    normalized = _normalize(_runs(cpu_source=False), "session_runs", {2: GPU})
    assert [m[3:] for m in _markers(normalized)] == [(1000, 2005), (2005, 3710)]


def test_one_session_run_is_one_step_without_a_remark() -> None:
    raw = _raw([_event("tf_op", "_SOURCE:NoOp", 50, 1), _event("tf_op", "x:MatMul", 60, 40)])
    normalized = _normalize(raw, "session_runs", {1: CPU})
    assert _markers(normalized) == [(0, 1, STEP_THREAD, 50, 100)]
    assert not any("Session.run" in r for r in normalized.notes.remarks)


# --- repeats, a rank read a batch at a time (step_inference.RepeatState) -------------------------


def _kept_in_batches(raw: pa.Table, size: int) -> pa.Table:
    """What RepeatState keeps of ``raw`` read ``size`` rows at a time, as from_repeats reads it."""
    state = RepeatState()
    for start in range(0, raw.num_rows, size):
        state.add(raw.slice(start, size))
    return state.table()


def _inferred(raw: pa.Table) -> tuple[list[tuple[int, int, int, int]], str, list[str]]:
    notes = Notes()
    found = step_markers(raw, "repeats", {}, notes)
    assert found is not None
    m = found.markers
    rows = list(
        zip(*(m.column(c).to_pylist() for c in (S.PID, S.TID, S.TS_NS, S.DUR_NS)), strict=True)
    )
    return rows, found.how, notes.remarks


def _op(name: str, ts: int, dur: int, tid: int = 5, cat: str = "cpu_op") -> dict[str, Any]:
    return _event(cat, name, ts, dur, **{S.TID: tid, S.KIND: S.KIND_OP})


# Three loops of one trace each: the first step of an optimizer-cut loop starts at the loop's
# first call that ends by the first boundary (here a call at 5 on the loop's thread, ended long
# before the first optimizer step, beside a frame around the whole loop that must not count); a
# data-loader-cut loop's last step ends at the last call on the loader's thread (at 950); an
# annotated loop is cut at its annotation's calls.
OPTIMIZER = [
    _op("<module>", 0, 1000),  # a frame around the whole loop: ends after the first boundary
    _op("aten::empty", 5, 1),
    _op("aten::mm", 20, 30),
    _op("Optimizer.step#SGD.step", 60, 20),
    _op("aten::mm", 100, 30),
    _op("Optimizer.step#SGD.step", 140, 20),
    _op("aten::mm", 200, 30),
    _op("Optimizer.step#SGD.step", 240, 20),
    _op("aten::mm", 3, 2, tid=9),  # another thread, earlier: not the loop's
]
LOADER = [
    _op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 10),
    _op("aten::mm", 120, 50),
    _op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 300, 10),
    _op("aten::mm", 320, 50),
    _op("aten::add", 900, 50),  # the loader's thread's last call ends at 950
]
ANNOTATED = [
    _op("train_step", 0, 90, cat="user_annotation"),
    _op("aten::mm", 10, 50),
    _op("train_step", 100, 90, cat="user_annotation"),
    _op("aten::mm", 110, 50),
    _op("train_step", 200, 95, cat="user_annotation"),
]


@pytest.mark.parametrize(
    "rows", [OPTIMIZER, LOADER, ANNOTATED], ids=["optimizer", "loader", "annotated"]
)
@pytest.mark.parametrize("size", [1, 2, 3, 100])
def test_repeats_inferred_from_what_a_batched_read_keeps(
    rows: list[dict[str, Any]], size: int
) -> None:
    raw = _raw(rows)
    whole = _inferred(raw)
    assert len(whole[0]) >= 2, whole  # (the loop is found)
    kept = _kept_in_batches(raw, size)
    assert kept.num_rows < raw.num_rows or size >= raw.num_rows or rows is ANNOTATED
    assert _inferred(kept) == whole


def test_the_optimizer_loops_first_step_and_the_loaders_last_end_by_hand() -> None:
    # optimizer: the first step from 5 (not the frame at 0, which ends after 80)
    assert [(ts, ts + dur) for _, _, ts, dur in _inferred(_raw(OPTIMIZER))[0]] == [
        (5, 80), (80, 160), (160, 260),
    ]  # fmt: skip
    # loader: from one __next__ to the next, the last to the thread's last end (950)
    assert [(ts, ts + dur) for _, _, ts, dur in _inferred(_raw(LOADER))[0]] == [
        (100, 300), (300, 950),
    ]  # fmt: skip
