"""Every sample and shared trace: each step's critical path tiles the job's step, and replaying
the graph with no change reproduces every measured step within 2% (the replay takes every start
from predecessors and edges, never from the recorded start: tests/unit/test_critical_path.py
shows it failing when an edge type is dropped)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import beyond_unit, for_unit
from tests.golden.cases import SAMPLE_CASES, shared_cases
from traceview.analysis import critical_path as cp
from traceview.analysis.critical_path import build_graph, critical_paths, replay
from traceview.analysis.critical_path.walk import walk as cp_walk
from traceview.analysis.crossrank import Matched
from traceview.model import schema as S
from traceview.runs import open_run
from traceview.store import rundir as R

REPO = Path(__file__).resolve().parents[2]
TRACES = sorted(
    {argv[-1] for argv in [*SAMPLE_CASES.values(), *shared_cases().values()] if argv[0] == "report"}
)


def _path(argv: str) -> Path:
    path = Path(argv)
    return path if path.is_absolute() else REPO / path


EVERY_TRACE = [
    *for_unit(TRACES, lambda t: (_path(t),)),
    *beyond_unit(TRACES, lambda t: (_path(t),)),
]


def _inputs(trace: str) -> tuple[pa.Table, Matched, list[int | None]]:
    """A run's segments (on the clock its calls were matched on), matched calls and steps."""
    with open_run([_path(trace)]) as run:
        cross = run.cross
        segments = run.segments.read()
        if cross is not None and cross.clocks is not None:
            frame = pl.from_arrow(segments)
            assert isinstance(frame, pl.DataFrame)
            segments = cross.clocks.shift(frame, S.START_NS, S.END_NS).to_arrow()
        steps = sorted(set(run.steps.column(S.STEP).to_pylist()), key=lambda s: (s is None, s))
        matched = cross.matched if cross is not None else Matched(pl.DataFrame())
    return segments, matched, steps


Inputs = Callable[[str], tuple[pa.Table, Matched, list[int | None]]]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    """``_inputs`` of a trace, made once for the tests below (each gets its own copy, read back
    from a file: nothing one test does to them reaches another)."""
    folder = tmp_path_factory.mktemp("inputs")
    made: dict[str, Path] = {}

    def get(trace: str) -> tuple[pa.Table, Matched, list[int | None]]:
        if trace not in made:
            file = folder / f"{len(made)}.pickle"
            file.write_bytes(pickle.dumps(_inputs(trace)))
            made[trace] = file
        return pickle.loads(made[trace].read_bytes())  # type: ignore[no-any-return]

    return get


@pytest.mark.parametrize("trace", EVERY_TRACE)
def test_replay_reproduces_every_step_and_the_path_tiles_it(trace: str, inputs: Inputs) -> None:
    segments, matched, steps = inputs(trace)
    graph = build_graph(segments, matched, steps)
    assert graph is not None, "no segments"
    paths = critical_paths(graph)
    assert len(paths) == len(steps)
    replayed = replay(graph)
    assert replayed.converged
    for path in paths:
        step = path.end_ns - path.start_ns
        assert sum(x.dur_ns for x in path.pieces) == pytest.approx(step, rel=0.01), path.step
        assert replayed.step_ns[path.step] == pytest.approx(step, rel=0.02), path.step


@pytest.mark.parametrize("trace", EVERY_TRACE)
def test_the_steps_laid_out_at_once_are_the_steps_walked_alone(trace: str, inputs: Inputs) -> None:
    """The walk lays out at once the steps whose last rank never waits (``walk``): their paths,
    and every other step's, are those of each step walked alone."""
    segments, matched, steps = inputs(trace)
    graph = build_graph(segments, matched, steps)
    assert graph is not None, "no segments"
    at_once, alone = cp_walk(graph), cp_walk(graph, at_once=False)
    assert at_once.steps.tolist() == alone.steps.tolist()
    assert at_once.reasons == alone.reasons
    assert at_once.offsets.tolist() == alone.offsets.tolist()
    assert at_once.frame.equals(alone.frame)


@pytest.mark.parametrize("trace", EVERY_TRACE)
def test_steps_in_batches_give_one_graphs_path_blame_and_what_ifs(
    trace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, inputs: Inputs
) -> None:
    """With room for one step a graph (each step its own batch, but for steps tied by a call),
    the path, blame, per-step paths, what-ifs and the exported path are one graph's; and so
    are they where the segments are read from a file a row group at a time (each batch reads
    only the groups its steps may lie in, by their statistics)."""
    segments, matched, steps = inputs(trace)
    counted = steps[1:] or steps  # (the first step as warm-up, as a report may count them)
    medians = {S.FORWARD: 1.0, S.BACKWARD: 2.0}
    whole = cp.explain(segments, matched, steps, counted, medians, ["faster:comm:2"])
    table = cp.path_table(segments, matched, steps)
    monkeypatch.setattr(cp.source, "GRAPH_ROWS", 1)
    source = cp._source(segments, matched, steps, None)
    assert source is not None
    assert len(steps) == 1 or len(cp._batches(source, source.steps)) > 1
    assert cp.explain(segments, matched, steps, counted, medians, ["faster:comm:2"]) == whole
    assert cp.path_table(segments, matched, steps).equals(table)
    file = tmp_path / "segments.parquet"
    pq.write_table(segments, file, row_group_size=max(1, segments.num_rows // 16))
    on_disk = R.table_on_demand(file, segments.schema)
    try:
        assert cp.explain(on_disk, matched, steps, counted, medians, ["faster:comm:2"]) == whole
    finally:
        on_disk.close()


@pytest.mark.parametrize("trace", EVERY_TRACE)
def test_the_cause_saves_no_more_than_its_time_on_the_path(trace: str) -> None:
    """Issue 48: the report's cause agrees with its path. Its change only shortens what it
    removes, so every chain of the graph loses at most its own share of that, and the step
    replayed without the cause is at least the measured path less the cause's time on it: the
    cause saves (``ms``) at most its blamed time (``blamed_ms``), step by step and so on the
    mean. It is one of the report's replayed what-ifs, with the speedup its step gives."""
    with open_run([_path(trace)]) as run:
        report = run.report()
    found = [c for c in (report.summary.cause,) if c is not None]
    whatif = {w.change: w for w in report.whatif}
    for cause in found:
        assert cause.ms <= cause.blamed_ms * 1.01 + 0.01, cause
        assert cause.change in whatif, (cause.change, sorted(whatif))
        assert cause.step_ms == whatif[cause.change].step_ms
        base = whatif["none"].step_ms
        assert cause.ms == pytest.approx(base - cause.step_ms, abs=2e-3)
        assert cause.speedup == pytest.approx(base / cause.step_ms, abs=2e-3)
        assert cause.text  # the words the headline prints
