"""One contract over normalize's passes, on every sample and shared trace: each pass runs in the
documented order, returns per-event arrays of the rank's length with codes in range, and keeps
the invariants the passes after it rely on (trees nest, step windows are disjoint and hold their
events, device activities link to host calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import for_unit, parser_of
from tests.unit.test_parser_contract import TRACES
from traceview.model import schema as S
from traceview.normalize.calltrees import CallTrees
from traceview.normalize.classify import Classes
from traceview.normalize.devices import Collectives, DeviceLinks
from traceview.normalize.phases import HostPhases
from traceview.normalize.pipeline import PASSES, RankMeta, normalize
from traceview.normalize.rules import rules_for
from traceview.normalize.steps import InferredSteps, LayoutResult, Steps, with_markers

N_PHASES = len(S.EVENT_PHASES)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.results: dict[str, Any] = {}

    def __call__(self, name: str, result: Any) -> None:
        self.seen.append(name)
        self.results[name] = result


def _check_inferred(before: pa.Table, inferred: InferredSteps | None) -> None:
    """Step markers only for a trace without any, all of kind step on one thread (that the pass
    names, or the trace's own thread they were found on), each within the trace's time."""
    if inferred is None:
        return
    kinds = set(before.column(S.KIND).to_pylist())
    assert S.KIND_STEP not in kinds, "markers are inferred only where the trace has none"
    markers = inferred.markers
    assert markers.schema.equals(S.LAID_OUT_SCHEMA, check_metadata=False)
    assert set(markers.column(S.KIND).to_pylist()) <= {S.KIND_STEP}
    # they state what they are: kind step and a step number each, read by no rule
    assert set(markers.column(S.STATED_KIND).to_pylist()) <= {S.KIND_STEP}
    assert markers.column(S.STATED_STEP).null_count == 0
    pids, tids = markers.column(S.PID).to_pylist(), markers.column(S.TID).to_pylist()
    threads = {f"{p}/{t}" for p, t in zip(pids, tids, strict=True)}
    before_pids, before_tids = before.column(S.PID).to_pylist(), before.column(S.TID).to_pylist()
    own = {f"{p}/{t}" for p, t in zip(before_pids, before_tids, strict=True)}
    # on a thread of their own that the pass names, or (inferred where the training loop
    # repeats) on the trace's thread whose calls repeat, which keeps the trace's name
    assert len(threads) <= 1
    assert set(inferred.threads) == threads or (not inferred.threads and threads <= own)
    if markers.num_rows:
        ts = before.column(S.TS_NS)
        end = pc.max(pc.add(ts, before.column(S.DUR_NS))).as_py()
        assert pc.min(markers.column(S.TS_NS)).as_py() >= pc.min(ts).as_py()
        assert pc.max(pc.add(markers.column(S.TS_NS), markers.column(S.DUR_NS))).as_py() <= end


def _check(results: dict[str, Any]) -> None:
    assert results["kinds"].column(S.KIND).null_count == 0, "every event has a kind after 'kinds'"
    layout = results["layout"]
    assert layout is None or isinstance(layout, LayoutResult)
    _check_inferred(results["stray_times"], results["infer_steps"])
    raw: pa.Table = with_markers(results["stray_times"], results["infer_steps"])
    n = raw.num_rows

    classes: Classes = results["classify"]
    for array in (classes.kind, classes.phase, classes.rule_op, classes.default_op):
        assert len(array) == n
    if layout is not None:  # the events the pass made are what it says, whatever their names
        assert layout.events.schema.equals(S.LAID_OUT_SCHEMA, check_metadata=False)
        stated = raw.select([S.STATED_KIND, S.STATED_PHASE, S.STATED_OP]).to_pylist()
        made = [i for i, row in enumerate(stated) if row[S.STATED_KIND] is not None]
        assert made, "the layout pass makes step markers or spans"
        for i in made:
            row = stated[i]
            assert S.EVENT_KINDS[classes.kind[i]] == row[S.STATED_KIND]
            phase = classes.phase[i]
            assert (S.EVENT_PHASES[phase] if phase >= 0 else None) == row[S.STATED_PHASE]
            op = classes.rule_op[i]
            assert (classes.ops[op] if op >= 0 else None) == row[S.STATED_OP]
    assert classes.kind.min(initial=0) >= 0 and classes.kind.max(initial=0) < len(S.EVENT_KINDS)
    assert classes.phase.min(initial=-1) >= -1 and classes.phase.max(initial=0) < N_PHASES
    assert classes.default_op.min(initial=0) >= 0

    trees: CallTrees = results["call_trees"]
    assert len(trees.depth) == len(trees.parent) == len(trees.self_ns) == n
    assert sorted(trees.hosts.tolist()) == sorted(trees.by_depth.tolist())
    has_parent = np.flatnonzero(trees.parent >= 0)
    parents = trees.parent[has_parent]
    assert (trees.depth[parents] == trees.depth[has_parent] - 1).all(), (
        "a child sits one level down"
    )
    ts = np.asarray(raw.column(S.TS_NS).to_numpy(zero_copy_only=False), np.int64)
    assert (ts[parents] <= ts[has_parent]).all(), "a parent starts no later than its child"
    assert (trees.self_ns >= 0).all()

    steps: Steps = results["steps"]
    assert len(steps.step) == n and len(steps.starts) == len(steps.markers)
    assert (steps.starts[1:] >= steps.ends[:-1]).all(), "step windows are disjoint and sorted"
    assert steps.training is not None or len(steps.markers) == 0

    positional: np.ndarray = results["positional_phases"]
    assert len(positional) == n and set(np.unique(positional).tolist()) <= set(range(N_PHASES))

    host: HostPhases = results["host_phases"]
    assert len(host.phase) == len(host.top_op) == len(host.near_op) == n
    decided = host.phase[trees.hosts]
    assert (decided < N_PHASES).all()

    devices: DeviceLinks = results["link_devices"]
    assert len(devices.launcher) == len(devices.phase) == len(devices.op) == len(devices.rows)
    assert not np.isin(devices.rows, trees.hosts).any(), "device activities are not on host trees"
    linked = devices.launcher[devices.launcher >= 0]
    assert np.isin(linked, trees.hosts).all(), "a device activity links to a host call"
    assert ((devices.phase >= 0) & (devices.phase < N_PHASES)).all()

    named: Collectives = results["collectives"]
    assert len(named.collective) == len(named.op) == n
    assert named.collective.max(initial=-1) < len(named.names)
    assert named.op.min(initial=0) >= 0 and named.op.max(initial=0) < len(classes.ops)


def _every_pass_keeps_its_contract(path: Path) -> None:
    parser = parser_of(path)
    assert parser is not None
    parsed = parser.parse(path)
    recorder = Recorder()
    normalized = normalize(
        parsed.events,
        rules_for(parser.framework),
        RankMeta("run", parsed.rank or 0, parser.framework, parsed.host),
        layout=parsed.layout,
        infer_steps=parsed.infer_steps,
        process_names=parsed.process_names,
        inspect=recorder,
    )
    assert tuple(recorder.seen) == PASSES
    _check(recorder.results)
    raw = with_markers(recorder.results["stray_times"], recorder.results["infer_steps"])
    assert normalized.events.num_rows == raw.num_rows
    assert normalized.steps == len(recorder.results["steps"].markers)


@pytest.mark.parametrize("path", for_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_pass_keeps_its_contract(path: Path) -> None:
    _every_pass_keeps_its_contract(path)
