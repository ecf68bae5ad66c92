"""Chunked ingest (traceview.ingest.large.chunked) against whole-rank ingest, event for event.

Every sample Kineto trace and every shared one is ingested twice: whole (today's path) and in
chunks of one step each (the smallest chunks there are, so that kernels launched in one step
and run in the next, and call trees that span steps, cross chunks). The events tables must be
equal in every column (compared in event-id order: the chunked path writes rows chunk by
chunk), and so must the analysis tables (computed a chunk at a time, ``analysis.parts``) and
``report --json``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import SHARED, for_unit
from traceview.analysis import RANK_TABLES
from traceview.analysis.parts import ChunkedAnalysis
from traceview.ingest.large import chunked, sinks, spill
from traceview.model import schema as S
from traceview.runs import ingest_run
from traceview.store import rundir as R
from traceview.views.text import to_json

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "sample_traces" / "pytorch").rglob("*.pt.trace.json.gz"))
SHARED_KINETO = sorted((SHARED / "pytorch").rglob("*.json.gz")) if SHARED.exists() else []
# TF1 Timelines, streamed too (no step markers: a step per Session.run, inferred in pass 1)
SHARED_TIMELINES = (
    sorted((SHARED / "tensorflow").glob("tf1_timeline_*/*.json.gz")) if SHARED.exists() else []
)
# Chainer's and MXNet's, read whole (begin and end records paired over the file; MXNet's laid
# out on its engine's timeline), then chunked
CHAINER = sorted((REPO / "sample_traces" / "chainer").rglob("*.chainer.json.gz"))
MXNET = sorted((REPO / "sample_traces" / "mxnet").rglob("rank-0.mxnet.json.gz"))
SHARED_MXNET = sorted((SHARED / "mxnet").rglob("*.json.gz")) if SHARED.exists() else []
# TensorFlow's profiles, read whole too (a protobuf), their steps inferred from the step groups
XPLANE = sorted((REPO / "sample_traces" / "tensorflow").rglob("rank-0.xplane.pb"))
SHARED_XPLANE = sorted((SHARED / "tensorflow").rglob("*.xplane.pb")) if SHARED.exists() else []
TRACES = [
    *SAMPLES,
    *SHARED_KINETO,
    *SHARED_TIMELINES,
    *CHAINER,
    *MXNET,
    *SHARED_MXNET,
    *XPLANE,
    *SHARED_XPLANE,
]


def _ingest(
    path: Path,
    out: Path,
    chunks: bool,
    monkeypatch: pytest.MonkeyPatch,
    rows: int = 1,
    analysed_in_chunks: bool = True,
    piece: int | None = None,
    rules: Path | None = None,
) -> list[int]:
    """Ingest one trace (``rules``: with that rules file); the number of chunks each chunked
    rank was normalized in. Fails where the analysis was not done a chunk at a time, unless
    ``analysed_in_chunks`` is False."""
    counts: list[int] = []
    real = chunked.normalize_chunk

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts[-1] += 1
        return real(*args, **kwargs)

    real_rank = chunked._normalize_chunked

    def rank(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts.append(0)
        done = real_rank(*args, **kwargs)
        if not isinstance(done, chunked.ChunkedRank):
            counts[-1] = -1  # the whole-rank path after all (on the events read once)
        return done

    real_finish = ChunkedAnalysis.finish

    def finish(self: ChunkedAnalysis) -> dict[str, pa.Table] | None:
        tables = real_finish(self)
        # the analysis was done a chunk at a time, not read back whole
        assert tables is not None, "a fact guessed in the first pass did not hold"
        return tables

    real_in_process = sinks.InWorker.finish

    def in_process(self: sinks.InWorker) -> dict[str, pa.Table] | None:
        tables = real_in_process(self)
        # (the helper process's analysis: neither a wrong guess nor a dead helper)
        assert tables is not None, "the helper process did not analyse the rank"
        return tables

    with monkeypatch.context() as m:
        m.setattr(chunked, "normalize_chunk", counting)
        m.setattr(chunked, "_normalize_chunked", rank)
        if analysed_in_chunks:
            m.setattr(ChunkedAnalysis, "finish", finish)
            m.setattr(sinks.InWorker, "finish", in_process)
        m.setenv("TRACEVIEW_WHOLE_RANK", "0" if chunks else "1")
        # helper processes as a large trace has them (the samples are far below the size)
        m.setenv("TRACEVIEW_HELPER_MIN_BYTES", "0")
        m.setenv("TRACEVIEW_CHUNK_ROWS", str(rows))
        if piece is not None:
            m.setenv("TRACEVIEW_PIECE_ROWS", str(piece))
        ingest_run([path], out, jobs=1, rules_path=rules)
    return counts


def _events(run: Path) -> pa.Table:
    events = R.read_events(run).drop_columns([S.RUN_ID])
    return events.sort_by([(S.RANK, "ascending"), (S.EVENT_ID, "ascending")])


def _columns(table: pa.Table) -> dict[str, list]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _report(run: Path) -> dict:
    from traceview.commands.report import load_report

    report = json.loads(to_json(load_report([run])))
    for key in ("run_id", "path"):  # of the run directory, not of what is in it
        report["run"].pop(key)
    return report


def _without_ids(value: object, run: Path) -> object:
    """A report with the run's id and folder left out (they differ between two ingests)."""
    text = json.dumps(value, sort_keys=True).replace(str(run), "RUN")
    return json.loads(text)


def _assert_same_run(whole: Path, parts: Path) -> None:
    a, b = _events(whole), _events(parts)
    assert a.num_rows == b.num_rows
    ca, cb = _columns(a), _columns(b)
    for name in ca:
        if ca[name] != cb[name]:
            bad = [i for i, (x, y) in enumerate(zip(ca[name], cb[name], strict=True)) if x != y]
            row = bad[0]
            pytest.fail(
                f"column {name}: {len(bad)} of {a.num_rows} events differ, first event id "
                f"{ca[S.EVENT_ID][row]}: whole {ca[name][row]!r}, chunked {cb[name][row]!r}"
            )
    for name in (*RANK_TABLES, *S.SIDE_INPUTS):
        ta = R.read_table(whole / f"{name}.parquet")
        tb = R.read_table(parts / f"{name}.parquet")
        assert ta.column_names == tb.column_names, name
        assert _columns(ta) == _columns(tb), f"{name}.parquet differs"
    ra, rb = _report(whole), _report(parts)
    ma, mb = R.read_manifest(whole), R.read_manifest(parts)
    assert [r.steps for r in ma.ranks] == [r.steps for r in mb.ranks]
    assert [r.events for r in ma.ranks] == [r.events for r in mb.ranks]
    assert ma.notes == mb.notes
    assert _without_ids(ra, whole) == _without_ids(rb, parts)


def _assert_recomputed_in_chunks(run: Path, monkeypatch: pytest.MonkeyPatch, rows: int = 1) -> None:
    """A reader's recompute of the analysis (``open_run.reanalyze``) of a written rank, a chunk of
    one step at a time (without step markers: of about ``rows`` rows) read back from its events
    file, gives the tables ingest wrote."""
    from traceview.analysis import rank_tables
    from traceview.ingest.large.readback import analyse_written

    analysed = []
    for rank in R.event_ranks(run):  # (one, or a profile's devices: each)
        with monkeypatch.context() as m:
            m.setenv("TRACEVIEW_CHUNK_ROWS", str(rows))
            tables = analyse_written(
                run, rank, rank_tables, {"memory": R.read_side(run, "memory", [rank])}
            )
        assert tables is not None, "not analysed in chunks"
        analysed.append(tables)
    for name in RANK_TABLES:
        written = R.read_table(run / f"{name}.parquet")
        whole = pa.concat_tables([S.conform(t[name], written.schema) for t in analysed])
        assert _columns(whole) == _columns(written), name


def _record_slices(m: pytest.MonkeyPatch) -> list[int]:
    """Record, through ``m``, each slice ``ChunkedAnalysis`` analyses: how many windows it
    carried on from the slice before."""
    carried: list[int] = []
    real = ChunkedAnalysis._slice

    def in_slices(self: ChunkedAnalysis, *args, **kwargs):  # type: ignore[no-untyped-def]
        carried.append(len(self.open.ids))
        return real(self, *args, **kwargs)

    m.setattr(ChunkedAnalysis, "_slice", in_slices)
    return carried


@pytest.fixture(scope="module")
def whole_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[Path, pytest.MonkeyPatch], Path]:
    """The whole-rank ingest of a trace, made once per module (the tests only read it)."""
    runs: dict[Path, Path] = {}

    def get(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        if path not in runs:
            runs[path] = tmp_path_factory.mktemp("whole") / "run"
            _ingest(path, runs[path], False, monkeypatch)
        return runs[path]

    return get


@pytest.mark.parametrize("rows", [1, 1 << 30], ids=["step-ends", "no-step-ends"])
@pytest.mark.parametrize("path", for_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_steps_cut_inside_equal_whole(
    path: Path,
    rows: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    whole_run: Callable[[Path, pytest.MonkeyPatch], Path],
) -> None:
    """Every stretch of more than a few hundred events cut inside, at phase markers: steps in
    several chunks each (``rows`` 1: and cut at every step's end too; 1 << 30: at no step's
    end, so the chunks also hold the ends of steps), their windows analysed a slice at a time
    (``analysis.parts``, memory records or not), equal to the whole-rank path."""
    whole = whole_run(path, monkeypatch)
    with monkeypatch.context() as m:  # (the analysis on a thread here, to see it slice)
        m.setenv("TRACEVIEW_HELPER_PROCESSES", "0")
        sliced = _record_slices(m)  # per slice: the windows it went on with
        counts = _ingest(path, tmp_path / "parts", True, monkeypatch, rows, piece=300)
    rank = R.read_manifest(tmp_path / "parts").ranks[0]
    assert len(counts) == 1
    if rows == 1:  # a chunk per step at least
        assert counts[0] >= rank.steps, f"{rank.steps} steps, chunks {counts}"
    # (without step markers: the one window, cut in pieces where it has phase markers)
    if rank.events > 4 * 300 * (rank.steps + 1):  # steps long enough to be cut inside
        assert counts[0] > rank.steps, f"{rank.steps} steps, chunks {counts}"
        assert any(sliced), "no window was analysed a slice at a time"
    _assert_same_run(whole, tmp_path / "parts")


#: What a training loop repeats that step inference cuts steps at (normalize/step_inference.py):
#: left out with the markers, so that the trace is one window on both paths (the chunked path
#: does not infer steps).
_REPEATS = ("ProfilerStep#", "Optimizer.", "enumerate(DataLoader)")


def _without_markers(source: Path, out: Path, extra: list[dict] | None = None) -> Path:
    """``source`` with its ProfilerStep markers left out (a whole-run profile that never
    called ``prof.step()``) and the loop's calls that step inference finds steps at (optimizer
    steps, data-loader calls, user annotations), plus ``extra`` events, as a plain trace
    file."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    trace["traceEvents"] = [
        e
        for e in trace["traceEvents"]
        if not str(e.get("name", "")).startswith(_REPEATS)
        and e.get("cat") != "user_annotation"
        and "run_backward" not in str(e.get("name", ""))
    ] + (extra or [])
    out.write_text(json.dumps(trace))
    return out


def _timeline(out: Path, names_last: bool, runs: int = 3) -> Path:
    """A TF1 Timeline of ``runs`` Session.runs on the CPU (each from its ``_SOURCE`` node to
    the next), its processes named before the ops as TensorFlow writes them, or after."""
    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    names = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{device} {what}"}}
        for pid, what in ((1, "Compute"), (2, "Tensors"))
    ]
    graph = [
        ("_SOURCE", "NoOp", 5),
        ("layer/MatMul", "MatMul", 300),
        ("loss/SoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits", 80),
        ("gradients/layer/MatMul_grad/MatMul", "MatMul", 400),
        ("GradientDescent/update_layer/ApplyGradientDescent", "ApplyGradientDescent", 60),
    ]
    ops, ts = [], 1_490_280_005_000_000
    for _ in range(runs):
        for name, op, dur in graph:
            args = {"name": name, "op": op}
            ops.append({"ph": "X", "cat": "Op", "name": op, "pid": 1, "tid": 0, "ts": ts,
                        "dur": dur, "args": args})  # fmt: skip
            ts += dur + 10
        ts += 1000
    # (last: the op's process named in the file's last record, a chunk of its own)
    out.write_text(json.dumps({"traceEvents": ops + names[::-1] if names_last else names + ops}))
    return out


@pytest.mark.parametrize("names_last", [False, True], ids=["names-first", "names-last"])
def test_a_timeline_streams_in_chunks_whatever_its_names_order(
    names_last: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TF1 Timeline is streamed (decoded a few ops at a time here): its steps, one per
    Session.run, inferred in pass 1, a chunk each, equal to the whole-rank path. Ops whose
    process is named only later in the file are held back until it is, not dropped, and keep
    the file's order (the run equals the one whose names come first)."""
    from traceview.parsers import tf_timeline
    from traceview.parsers.chrome_stream import ChromeTraceReader
    from traceview.parsers.tf_timeline import TimelineStream

    monkeypatch.setattr(TimelineStream, "chunk_bytes", 600)
    path = _timeline(tmp_path / "timeline.json", names_last)
    reader = ChromeTraceReader(path, tf_timeline._decode_chunk, TimelineStream.chunk_bytes)
    assert len(list(reader)) > 1  # the ops decoded before their process's name, if it is last
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch)
    rank = R.read_manifest(tmp_path / "parts").ranks[0]
    assert (rank.steps, rank.events, counts) == (3, 15 + 3, [3])  # (the ops and 3 markers)
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")
    first = _ingest(
        _timeline(tmp_path / "first.json", False), tmp_path / "first", True, monkeypatch
    )
    assert first == counts
    _assert_same_run(tmp_path / "first", tmp_path / "parts")


def test_a_chunk_holds_the_names_of_its_own_inferred_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps inferred in pass 1 (a TF1 Timeline's Session.runs) are spilled in batches, each
    with the names its rows use: a chunk's rows carry the names of its own markers and a few
    more, not every marker's (a slice of one batch of them all held every name: 100,000 for as
    many Session.runs, in each chunk, decoded again by each pass over it). Equal to the
    whole-rank path."""
    runs = 400
    monkeypatch.setattr(chunked, "_MARKER_BATCH_ROWS", 16)
    path = _timeline(tmp_path / "timeline.json", False, runs)
    names: list[tuple[int, int]] = []  # per chunk: its markers, the names its rows carry
    real = chunked.read_chunk

    def reading(work: Path, chunk: int, shift: int) -> pa.Table | None:
        table = real(work, chunk, shift)
        if table is not None:
            markers = pc.sum(pc.equal(table.column(S.CAT), "traceview")).as_py() or 0
            carried = sum(len(c.dictionary) for c in table.column(S.NAME).chunks)
            names.append((markers, carried))
        return table

    monkeypatch.setattr(chunked, "read_chunk", reading)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch, rows=200)
    assert counts[0] >= 10 and sum(m for m, _ in names) == runs
    # (a chunk's markers, the ends of the two batches it cuts, and the graph's five op names)
    assert all(carried <= markers + 2 * 16 + 5 for markers, carried in names), names
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


def test_a_trace_without_markers_is_one_window_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace with no step markers is one window (the whole-rank path's): normalized in
    pieces cut at phase markers and analysed a slice at a time, the window carried across
    every slice, equal to the whole-rank path (the note that there are no markers included)."""
    source = REPO / "sample_traces" / "pytorch" / "gpu_async" / "rank-0.pt.trace.json.gz"
    path = _without_markers(source, tmp_path / "no-markers.pt.trace.json")
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    with monkeypatch.context() as m:
        m.setenv("TRACEVIEW_HELPER_PROCESSES", "0")
        carried = _record_slices(m)
        counts = _ingest(path, tmp_path / "parts", True, monkeypatch, piece=300)
    assert len(counts) == 1 and counts[0] >= 4, counts
    assert carried[0] == 0 and all(carried[1:]), carried  # one window, open until the end
    rank = R.read_manifest(tmp_path / "parts").ranks[0]
    assert rank.steps == 0
    steps = R.read_table(tmp_path / "parts" / "steps.parquet")
    assert steps.num_rows == 1 and steps.column(S.STEP).null_count == 1
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")
    # a reader's recompute takes it in chunks too (its kernels with the calls that launched them)
    _assert_recomputed_in_chunks(tmp_path / "parts", monkeypatch, rows=300)


@pytest.mark.parametrize(
    "source",
    [
        REPO / "sample_traces" / "pytorch" / "gpu_async" / "rank-0.pt.trace.json.gz",
        REPO / "sample_traces" / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz",
    ],
    ids=["gpu", "cpu-ddp"],
)
def test_a_long_window_writes_its_settled_segments_as_it_goes(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window's segments are written on as they settle (``parts._Pending.settled``), not held
    to its end (one step over a whole trace held every segment): held to a few rows here, in
    slices and in one piece, the run is the one made with them held, row for row."""
    from traceview.analysis import parts

    path = _without_markers(source, tmp_path / "no-markers.pt.trace.json")
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    flushed: list[int] = []
    real = parts._Pending.settled

    def settled(self: parts._Pending) -> pa.Table | None:
        table = real(self)
        flushed.append(0 if table is None else table.num_rows)
        return table

    for chunks in (False, True):
        out = tmp_path / f"held-{chunks}"
        with monkeypatch.context() as m:
            m.setenv("TRACEVIEW_HELPER_PROCESSES", "0")
            m.setattr(parts, "PENDING_SEGMENTS", 8)
            m.setattr(parts._Pending, "settled", settled)
            _ingest(path, out, chunks, monkeypatch, piece=300, analysed_in_chunks=chunks)
        assert sum(flushed) > 100, "no segment was written before its window ended"
        flushed.clear()
        _assert_same_run(tmp_path / "whole", out)


def test_memory_records_without_markers_in_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace without step markers but with memory records (one window over the whole rank,
    whose memory peaks, and the phase and operator at each, the whole path finds in all its
    events) goes the chunked way, a slice at a time, and gives the whole path's memory rows;
    so does a reader's recompute in chunks."""
    source = REPO / "sample_traces" / "pytorch" / "memory" / "rank-0.pt.trace.json.gz"
    path = _without_markers(source, tmp_path / "no-markers.pt.trace.json")
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    with monkeypatch.context() as m:
        m.setenv("TRACEVIEW_HELPER_PROCESSES", "0")
        slices = _record_slices(m)
        counts = _ingest(path, tmp_path / "parts", True, monkeypatch, piece=200)
    assert counts[0] >= 4 and len(slices) >= 4, (counts, slices)
    assert sum(1 for n in slices if n) >= 3, "the window was not carried across slices"
    memory = R.read_table(tmp_path / "parts" / "memory_steps.parquet")
    assert memory.num_rows >= 2 and memory.column(S.PEAK_OP).null_count < memory.num_rows
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")
    # in chunks of 300 rows, one chunk holds none of the training thread's rows (a thread with
    # three communication calls): the gap across it takes its phase from neighbours two chunks
    # apart, as over the whole rank (it stayed idle when a slice looked one chunk ahead)
    _assert_recomputed_in_chunks(tmp_path / "whole", monkeypatch, rows=300)


_DAY_US = 86_400 * 10**6


@pytest.mark.parametrize("two_parts", [False, True], ids=["one-piece", "two-parts"])
def test_events_with_corrupt_times_are_dropped_in_chunks(
    two_parts: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace with corrupt times (an operator 40 days before the rest, another lasting 31
    days, a third 45 days after) is read in chunks, not whole: the strays are found over the
    whole rank by its median, as the whole-rank path finds them, and the rest numbered
    without them; read in two parts at once too (both spills read again as one)."""
    source = REPO / "sample_traces" / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz"
    trace = json.loads(gzip.decompress(source.read_bytes()))
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    ops[5]["ts"] -= 40 * _DAY_US
    ops[len(ops) // 2]["dur"] = 31 * _DAY_US
    ops[-5]["ts"] += 45 * _DAY_US
    path = tmp_path / "corrupt.pt.trace.json"
    path.write_text(json.dumps(trace))
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    read: list[int] = []
    with monkeypatch.context() as m:
        if two_parts:
            m.setenv("TRACEVIEW_SPLIT_AT", "0.5")
            real = spill._in_two_parts

            def in_two(*args, **kwargs):  # type: ignore[no-untyped-def]
                done = real(*args, **kwargs)
                read.append(len(done.spills))
                return done

            m.setattr(spill, "_in_two_parts", in_two)
        else:
            m.setenv("TRACEVIEW_HELPER_PROCESSES", "0")
        counts = _ingest(path, tmp_path / "parts", True, monkeypatch)
    assert read == ([2] if two_parts else [])
    steps = R.read_manifest(tmp_path / "parts").ranks[0].steps
    assert steps and counts == [steps], counts  # in chunks, one a step
    notes = R.read_manifest(tmp_path / "parts").notes
    assert any("3 event(s) more than 30 days away" in n for n in notes.warnings), notes
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


@pytest.mark.parametrize("days", [[0, 29, 75, 75], [0, 0, 0, 90]])
def test_strays_of_a_rank_without_host_events_are_dropped_once(
    days: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank of kernels only (no host events: the whole-rank path after pass 1) with corrupt
    times: the whole-rank path's stray pass runs on the rows as read, once (a second pass
    over what the first left would take another median: day 29 dropped too)."""
    events = [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7,
         "ts": 1_000_000 + day * _DAY_US + i, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": 100 + i}}
        for i, day in enumerate(days)
    ]  # fmt: skip
    path = tmp_path / "gpu.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    _ingest(path, tmp_path / "whole", False, monkeypatch, analysed_in_chunks=False)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch, analysed_in_chunks=False)
    assert counts == [-1]  # (the whole-rank path, on the rows read once)
    whole, parts = R.read_manifest(tmp_path / "whole"), R.read_manifest(tmp_path / "parts")
    assert [r.events for r in parts.ranks] == [r.events for r in whole.ranks] == [3]
    assert parts.notes == whole.notes


def _helpers_left() -> list[str]:
    """Analysis threads and helper processes of this process still running."""
    import os
    import threading

    left = [t.name for t in threading.enumerate() if t.name == "traceview-analysis"]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])
        if (
            parent == os.getpid()
            and b"traceview.ingest.large.worker" in cmdline
            and " Z " not in stat
        ):
            left.append(f"helper process {pid}")
    return left


def _wait_for_no_helpers() -> list[str]:
    import time

    for _ in range(200):  # they end on their own once they see the end
        if not _helpers_left():
            break
        time.sleep(0.02)
    return _helpers_left()


def test_an_analysis_error_reaches_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis runs on a thread of its own beside the normalizing (no helper process: a
    single core): an error there is the ingest's error (not lost on the thread), and no
    thread is left behind."""
    monkeypatch.setenv("TRACEVIEW_HELPER_PROCESSES", "0")
    real_add = ChunkedAnalysis.add
    calls: list[int] = []

    def add(self: ChunkedAnalysis, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("analysis failed on the second chunk")
        return real_add(self, *args, **kwargs)

    monkeypatch.setattr(ChunkedAnalysis, "add", add)
    with pytest.raises(RuntimeError, match="second chunk"):
        _ingest(SAMPLES[0], tmp_path / "run", True, monkeypatch)
    assert len(calls) == 2  # the chunks after it were not analysed
    assert _wait_for_no_helpers() == []


def _random_segments(rng: np.random.Generator, n: int) -> pa.Table:
    """Segments in time order as slices leave them: stretches that run on into the next row
    (same labels, touching), time between operators (compute without one: ``gap_operators``
    names it by the operators around it), other kinds, a step change now and then."""
    start, ends, steps, phases, kinds, ops = [], [], [], [], [], []
    t, step = 0, 0
    for _ in range(n):
        step += int(rng.random() < 0.05)
        begin = t + int(rng.random() < 0.2) * int(rng.integers(1, 5))  # (a jump: no run-on)
        t = begin + int(rng.integers(1, 10))
        start.append(begin)
        ends.append(t)
        steps.append(step)
        phases.append(["forward", "backward"][int(rng.random() < 0.1)])
        kinds.append(["compute", "compute", "compute", "idle", "comm"][int(rng.integers(5))])
        ops.append([None, "a", "a", "b"][int(rng.integers(4))])
    return pa.table(
        {
            S.RANK: pa.array([0] * n, pa.int32()),
            S.STEP: pa.array(steps, pa.int64()),
            S.START_NS: pa.array(start, pa.int64()),
            S.END_NS: pa.array(ends, pa.int64()),
            S.PHASE: pa.array(phases, pa.string()),
            S.KIND: pa.array(kinds, pa.string()),
            S.OP: pa.array(ops, pa.string()),
        },
        schema=S.SEGMENTS_SCHEMA,
    )


@pytest.mark.parametrize("seed", range(20))
def test_settled_segments_join_as_the_whole_window_does(seed: int) -> None:
    """Whatever rows come after them, the settled rows of a window's segments so far
    (``parts._settled``) are joined and named alone as with every row of the window, and the
    rest joined after them gives the window's remaining rows."""
    from traceview.analysis.parts import _joined, _joined_segments, _segment_joins, _settled

    table = _random_segments(np.random.default_rng(seed), 400)
    whole = _columns(_joined_segments(table))
    cut_somewhere = False
    for so_far in range(2, table.num_rows + 1, 7):
        dictionary, named, new, gap = _segment_joins(table.slice(0, so_far))
        done = _settled(new, gap)
        assert 0 <= done < so_far
        if done:
            cut_somewhere = True
            head, rest = _joined_segments(table.slice(0, done)), _joined_segments(table.slice(done))
            # (the settled rows joined from the joins over every row so far: as alone)
            again = _joined(table.slice(0, done), dictionary, named[:done], new[:done])
            assert _columns(again) == _columns(head)
            assert _columns(pa.concat_tables([head, rest])) == whole, f"cut at {done} of {so_far}"
    assert cut_somewhere
