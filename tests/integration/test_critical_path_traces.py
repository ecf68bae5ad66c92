"""Every sample and shared trace: each step's critical path tiles the job's step, and replaying
the graph with no change reproduces every measured step within 2% (the replay takes every start
from predecessors and edges, never from the recorded start: tests/unit/test_critical_path.py
shows it failing when an edge type is dropped)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.conftest import beyond_unit, for_unit
from tests.golden.cases import SAMPLE_CASES, shared_cases
from traceview.analysis.critical_path import build_graph, critical_paths, replay
from traceview.analysis.crossrank import Matched
from traceview.model import schema as S
from traceview.store.analysed import open_run

REPO = Path(__file__).resolve().parents[2]
TRACES = sorted(
    {argv[-1] for argv in [*SAMPLE_CASES.values(), *shared_cases().values()] if argv[0] == "report"}
)


def _path(argv: str) -> Path:
    path = Path(argv)
    return path if path.is_absolute() else REPO / path


@pytest.mark.parametrize(
    "trace", [*for_unit(TRACES, lambda t: (_path(t),)), *beyond_unit(TRACES, lambda t: (_path(t),))]
)
def test_replay_reproduces_every_step_and_the_path_tiles_it(trace: str) -> None:
    with open_run([_path(trace)]) as run:
        cross = run.cross
        segments = run.tables["segments"]
        if cross is not None and cross.clocks is not None:
            frame = pl.from_arrow(segments)
            assert isinstance(frame, pl.DataFrame)
            segments = cross.clocks.shift(frame, S.START_NS, S.END_NS).to_arrow()
        steps = sorted(set(run.steps.column(S.STEP).to_pylist()), key=lambda s: (s is None, s))
        graph = build_graph(
            segments, cross.matched if cross is not None else Matched(pl.DataFrame()), steps
        )
    assert graph is not None, "no segments"
    paths = critical_paths(graph)
    assert len(paths) == len(steps)
    replayed = replay(graph)
    assert replayed.converged
    for path in paths:
        step = path.end_ns - path.start_ns
        assert sum(x.dur_ns for x in path.pieces) == pytest.approx(step, rel=0.01), path.step
        assert replayed.step_ns[path.step] == pytest.approx(step, rel=0.02), path.step
