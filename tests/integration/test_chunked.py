"""The integration tier's part of ``tests/unit/test_chunked.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import SHARED, beyond_unit
from tests.golden.cases import SAMPLE_CASES, shared_cases
from tests.unit.test_chunked import (
    REPO,
    SAMPLES,
    SHARED_KINETO,
    SHARED_TIMELINES,
    TRACES,
    _assert_recomputed_in_chunks,
    _assert_same_run,
    _columns,
    _ingest,
    _record_slices,
    _wait_for_no_helpers,
    _without_markers,
)
from traceview.analysis import RANK_TABLES
from traceview.ingest.large import chunked, sinks, spill
from traceview.ingest.large import route as route_module
from traceview.model import schema as S
from traceview.runs import ingest_run
from traceview.store import rundir as R


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """A trace's run ingested on the whole-rank path, once for the tests that compare with it
    (read only: what each test then ingests in chunks is its own)."""
    made: dict[Path, Path] = {}

    def run(path: Path) -> Path:
        if path not in made:
            out = tmp_path_factory.mktemp("whole") / "run"
            with pytest.MonkeyPatch.context() as m:
                assert _ingest(path, out, False, m) == []  # (no chunk: the whole rank)
            made[path] = out
        return made[path]

    return run


@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_chunked_ingest_equals_whole(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: Callable[[Path], Path]
) -> None:
    whole_run = whole(path)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch)
    manifest = R.read_manifest(tmp_path / "parts")
    steps = [r.steps for r in manifest.ranks]  # (a profile of several devices: a rank each)
    if all(steps):
        # one chunk per step: the chunked path ran, and in as many chunks as there are steps
        # (steps inferred where the loop repeats, without markers, too: from what pass 1 kept)
        assert sorted(counts) == sorted(steps), f"{steps} steps but chunks {counts}"
        _assert_recomputed_in_chunks(whole_run, monkeypatch)
    else:  # no step markers: one window, in chunks all the same (memory records or not)
        assert counts and min(counts) >= 1, counts
        _assert_recomputed_in_chunks(whole_run, monkeypatch, rows=300)
    _assert_same_run(whole_run, tmp_path / "parts")


def test_a_chrome_trace_read_with_rules_in_chunks_equals_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Chrome trace of a framework traceview has no parser for (JAX on CPU, read with the
    README's rules) is read whole (begin and end records paired over the file), then
    normalized and analysed a step at a time: equal to the whole-rank path."""
    trace = REPO / "examples" / "jax" / "perfetto_trace.json.gz"
    rules = REPO / "examples" / "rules" / "jax.toml"
    assert _ingest(trace, tmp_path / "whole", False, monkeypatch, rules=rules) == []
    counts = _ingest(trace, tmp_path / "parts", True, monkeypatch, rules=rules)
    steps = R.read_manifest(tmp_path / "parts").ranks[0].steps
    assert steps and counts == [steps], (steps, counts)
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


@pytest.mark.parametrize("rows", [1, 1 << 30], ids=["step-ends", "no-step-ends"])
@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_steps_cut_inside_equal_whole(
    path: Path,
    rows: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    whole: Callable[[Path], Path],
) -> None:
    """Every stretch of more than a few hundred events cut inside, at phase markers: steps in
    several chunks each (``rows`` 1: and cut at every step's end too; 1 << 30: at no step's
    end, so the chunks also hold the ends of steps), their windows analysed a slice at a time
    (``analysis.parts``, memory records or not), equal to the whole-rank path."""
    whole_run = whole(path)
    with monkeypatch.context() as m:  # (the analysis on a thread here, to see it slice)
        m.setenv("TRACEVIEW_HELPER_PROCESSES", "0")
        sliced = _record_slices(m)  # per slice: the windows it went on with
        counts = _ingest(path, tmp_path / "parts", True, monkeypatch, rows, piece=300)
    ranks = R.read_manifest(tmp_path / "parts").ranks  # (a profile of several devices: each)
    # (steps inferred where the trace marks none: chunked too)
    assert len(counts) == len(ranks), (counts, ranks)
    for rank, count in zip(sorted(ranks, key=lambda r: r.rank), counts, strict=True):
        if rows == 1:  # a chunk per step at least
            assert count >= rank.steps, f"{rank.steps} steps, chunks {counts}"
        # (without step markers: the one window, cut in pieces where it has phase markers)
        if rank.events > 4 * 300 * (rank.steps + 1):  # steps long enough to be cut inside
            assert count > rank.steps, f"{rank.steps} steps, chunks {counts}"
            assert any(sliced), "no window was analysed a slice at a time"
    _assert_same_run(whole_run, tmp_path / "parts")


@pytest.mark.parametrize("rows", [8000, 12000])
def test_chunks_of_several_steps(
    rows: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of as many whole steps as hold about ``rows`` events (the last one takes what
    is left and what follows the last step)."""
    path = REPO / "sample_traces" / "pytorch" / "gpu_ddp_nccl" / "rank-0.pt.trace.json.gz"
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch, rows)
    steps = R.read_manifest(tmp_path / "parts").ranks[0].steps
    assert len(counts) == 1 and 1 < counts[0] < steps
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


def test_the_samples_cross_chunks() -> None:
    """The traces above hold what crosses a chunk: kernels that run after the step whose call
    launched them ends, and host events that outlive the step they start in."""
    from traceview.normalize.pipeline import RankMeta, normalize
    from traceview.normalize.rules import rules_for
    from traceview.parsers.kineto import KinetoParser

    late_kernels = spanning = 0
    for path in [*SAMPLES, *SHARED_KINETO, *SHARED_TIMELINES]:  # (complete events, as Kineto's)
        parsed = KinetoParser().parse(path)
        events = normalize(
            parsed.events, rules_for("pytorch", None), RankMeta("x", 0, "pytorch")
        ).events
        step = np.asarray(events.column(S.STEP).fill_null(-1).to_numpy(), np.int64)
        kind = np.asarray(events.column(S.KIND).cast(pa.string()).to_pylist(), object)
        ts = events.column(S.TS_NS).to_numpy()
        end = ts + events.column(S.DUR_NS).to_numpy()
        markers = (kind == S.KIND_STEP) & (step >= 0)
        step_end = dict(zip(step[markers].tolist(), end[markers].tolist(), strict=True))
        if not step_end:
            continue
        ends = np.array([step_end.get(s, np.iinfo(np.int64).max) for s in step.tolist()])
        device = np.isin(kind, list(S.DEVICE_ACTIVITY_KINDS)) & (step >= 0)
        late_kernels += int((device & (ts >= ends)).sum())
        host = np.isin(kind, list(S.HOST_TREE_KINDS)) & ~markers & (step >= 0)
        spanning += int((host & (end > ends)).sum())
    assert spanning > 0
    if not SHARED_KINETO:  # the samples' kernels all end inside the step that launched them
        pytest.skip(f"kernels that outrun their step are in the shared traces ({SHARED}), absent")
    assert late_kernels > 0


def _make_big(tmp_path: Path, mb: float, gz: bool = False) -> Path:
    out = tmp_path / "big"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "make_big_trace.py"),
        "--target-mb",
        str(mb),
        "-o",
        str(out),
    ]
    if gz:
        cmd.append("--gzip")
    source = SHARED / "pytorch" / "hta_nccl_parser_config" / "nccl_data.json.gz"
    if not source.exists():
        pytest.skip(f"make_big_trace's source trace is in {source.parent} (absent here)")
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return next(out.glob("rank0.pt.trace.json*"))


def test_a_trace_written_as_pytorch_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make_big_trace's output: every CPU event first, then every device activity (Kineto's
    order), gzip: the device activities are routed back to their launchers' chunks."""
    path = _make_big(tmp_path, 40, gz=True)
    text = gzip.decompress(path.read_bytes())
    assert 0 < text.rfind(b'"cat": "cpu_op"') < text.find(b'"cat": "kernel"')  # CPU first
    del text
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch)
    assert counts and counts[0] > 10
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


@pytest.mark.parametrize("piece", [None, 300], ids=["whole-step", "in-pieces"])
def test_one_huge_step(piece: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace that is a single step: one chunk where the step is short of twice
    ``PIECE_ROWS`` events (with the events before and after it), else cut in pieces at phase
    markers, its window analysed a slice at a time."""
    source = REPO / "sample_traces" / "pytorch" / "gpu_async" / "rank-0.pt.trace.json.gz"
    trace = json.loads(gzip.decompress(source.read_bytes()))
    events = trace["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) > 2
    first, last = steps[0], steps[-1]
    kept = [e for e in events if e is first or e not in steps]
    first["dur"] = last["ts"] + last["dur"] - first["ts"]  # one step over all of them
    trace["traceEvents"] = kept
    path = tmp_path / "one-step.pt.trace.json"
    path.write_text(json.dumps(trace))
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch, piece=piece)
    rank = R.read_manifest(tmp_path / "parts").ranks[0]
    assert rank.steps == 1
    if piece is None:
        assert counts == [1]
    else:
        assert len(counts) == 1 and counts[0] >= rank.events // (4 * piece), counts
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")
    # a reader's recompute cuts the step in pieces too (at the phase annotations, its kernels
    # with the calls that launched them), its window carried into the next: it never reads the
    # step whole (it did: one chunk)
    with monkeypatch.context() as m:
        carried = _record_slices(m)
        _assert_recomputed_in_chunks(tmp_path / "parts", monkeypatch, rows=300)
    assert len(carried) >= 5 and carried[0] == 0 and carried[1] == 1, carried


def test_a_wrong_guess_of_the_training_thread_is_normalized_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without step markers the first pass guesses the training thread from the time in each
    thread's operators, nested ones included; the whole-rank path weighs outermost operators
    only. A second thread whose flat operators outweigh the main thread's outermost ones but
    not all of its nested ones makes the guess wrong: the chunks are normalized again with
    the thread the call trees name, and the run equals the whole-rank path's."""
    source = REPO / "sample_traces" / "pytorch" / "explicit" / "rank-0.pt.trace.json.gz"
    events = json.loads(gzip.decompress(source.read_bytes()))["traceEvents"]
    main = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("tid") == 6306 and "ProfilerStep#" not in e["name"]
    ]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in main)
    union, reach = 0.0, -1.0
    for start, end in spans:  # the main thread's outermost time: the union of its operators
        union += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    nested = sum(float(e["dur"]) for e in main)
    assert nested > 1.5 * union  # (the trace nests deep enough for the test)
    flat, first = (union + nested) / 2, spans[0][0]
    extra = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::busy", "pid": main[0]["pid"], "tid": 7777,
         "ts": first + i * flat / 10, "dur": flat / 10 - 1, "args": {}}
        for i in range(10)
    ]  # fmt: skip
    path = _without_markers(source, tmp_path / "two-threads.pt.trace.json", extra)
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    wrong: list[tuple[int, int]] = []

    class Recorded(chunked._WrongGuess):
        def __init__(self, training: tuple[int, int]):
            wrong.append(training)
            super().__init__(training)

    with monkeypatch.context() as m:
        m.setattr(chunked, "_WrongGuess", Recorded)
        _ingest(path, tmp_path / "parts", True, monkeypatch, piece=300)
    assert [t[1] for t in wrong] == [7777], wrong  # guessed the main thread, then corrected
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


def test_an_error_in_the_helper_process_reaches_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis runs in a helper process: its error (here: a chunk's file is gone before
    it reads it) is raised by the ingest, and the helper ends."""
    real_send = sinks.InWorker._send

    def send(self: sinks.InWorker, message: object) -> None:
        if isinstance(message, tuple) and message[0] == "chunk" and self.sent == 1:
            Path(message[1]).unlink()
        real_send(self, message)

    monkeypatch.setattr(sinks.InWorker, "_send", send)
    with pytest.raises(FileNotFoundError):
        _ingest(SAMPLES[0], tmp_path / "run", True, monkeypatch)
    assert _wait_for_no_helpers() == []


def test_a_killed_helper_process_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper process that analyses the chunks is killed (SIGKILL, for real) at its first
    chunk: the ingest goes on, and the rank is analysed from its events file instead (read back
    in chunks, ``readback.analyse_written``)."""
    from traceview.ingest import rank as rank_module

    path = SAMPLES[0]
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    monkeypatch.setenv("TRACEVIEW_FAULT", "helper:analyse")
    read_back: list[int] = []
    real_read = rank_module.analyse_written

    def reading(run: Path, rank: int, *rest: Any) -> Any:
        read_back.append(rank)
        return real_read(run, rank, *rest)

    with monkeypatch.context() as m:
        m.setattr(rank_module, "analyse_written", reading)
        counts = _ingest(path, tmp_path / "parts", True, monkeypatch, analysed_in_chunks=False)
    assert counts and counts[0] > 1
    assert read_back  # analysed from the events file
    monkeypatch.delenv("TRACEVIEW_FAULT")
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")
    assert _wait_for_no_helpers() == []


@pytest.mark.parametrize("processes", ["1", "0"])
def test_a_normalize_error_ends_the_analysis_helper(
    processes: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACEVIEW_HELPER_PROCESSES", processes)
    real = chunked.normalize_chunk
    seen: list[int] = []

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(1)
        if len(seen) == 3:
            raise RuntimeError("normalize failed on the third chunk")
        return real(*args, **kwargs)

    monkeypatch.setattr(chunked, "normalize_chunk", failing)
    with pytest.raises(RuntimeError, match="third chunk"):
        # (_ingest wraps normalize_chunk again: this failing one is what it calls)
        _ingest(SAMPLES[0], tmp_path / "run", True, monkeypatch)
    assert _wait_for_no_helpers() == []


# --- a plain trace read in two parts at once (a helper process reads the later part) --------

TWO_PARTS = [
    REPO / "sample_traces" / "pytorch" / "gpu_ddp_nccl" / "rank-0.pt.trace.json.gz",
    REPO / "sample_traces" / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz",
    *[p for p in SHARED_KINETO if p.parent.name in ("hta_nccl_parser_config", "hta_amd_mi250")],
    # no step markers: its steps inferred, the markers a third spill after the two parts'
    *[p for p in SHARED_KINETO if p.parent.name == "param_linear"],
]


def _plain(path: Path, tmp_path: Path) -> Path:
    out = tmp_path / path.name.removesuffix(".gz")
    out.write_bytes(gzip.decompress(path.read_bytes()))
    return out


def _in_two_parts(monkeypatch: pytest.MonkeyPatch, at: float) -> list[str]:
    """Read every chunked trace in two parts, the later from ``at`` of the file; returns how
    each first pass went: "helper" (the helper process read the later part), "here" (the
    helper failed: read in this process), "one piece" (no event starts at the cut)."""
    monkeypatch.setenv("TRACEVIEW_SPLIT_AT", str(at))
    how: list[str] = []
    real_two, real_later = spill._in_two_parts, spill.read_later_part

    def two(*args, **kwargs):  # type: ignore[no-untyped-def]
        how.append("helper")
        try:
            return real_two(*args, **kwargs)
        except spill.SplitMismatch:
            how[-1] = "one piece"
            raise

    def later_here(*args, **kwargs):  # type: ignore[no-untyped-def]
        how[-1] = "here"
        return real_later(*args, **kwargs)

    monkeypatch.setattr(spill, "_in_two_parts", two)
    monkeypatch.setattr(spill, "read_later_part", later_here)
    return how


@pytest.mark.parametrize("at", [0.3, 0.7])
@pytest.mark.parametrize("source", TWO_PARTS, ids=lambda p: p.parent.name)
def test_a_trace_read_in_two_parts_equals_whole(
    source: Path, at: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _plain(source, tmp_path)
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    how = _in_two_parts(monkeypatch, at)
    counts = _ingest(path, tmp_path / "parts", True, monkeypatch)
    assert how == ["helper"]
    assert counts[0] != 0
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


@pytest.mark.parametrize("fault", [None, "helper:route"])
def test_the_helper_routes_the_later_part(
    fault: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper that read the later part routes its rows to the chunks while the ingest
    routes its own; killed while it routes (SIGKILL, for real), the ingest routes that part
    itself (its files cut short thrown away) and analyses the rank from its events file."""
    path = _plain(TWO_PARTS[0], tmp_path)
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    how = _in_two_parts(monkeypatch, 0.5)
    routed: list[str] = []
    real = route_module._route

    def route(spills, routing, work, prefix):  # type: ignore[no-untyped-def]
        routed.append(prefix)
        return real(spills, routing, work, prefix)

    with monkeypatch.context() as m:
        m.setattr(route_module, "_route", route)
        if fault:
            m.setenv("TRACEVIEW_FAULT", fault)
        _ingest(path, tmp_path / "parts", True, monkeypatch, analysed_in_chunks=fault is None)
    assert how == ["helper"]
    # this process routed its own part, and the later one only where the helper died
    assert routed == (["chunk"] if fault is None else ["chunk", "chunk-later"]), routed
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")
    assert _wait_for_no_helpers() == []


def test_a_failed_helper_leaves_its_part_to_the_ingest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper processes fail (here: their interpreter does not run): the ingest reads the
    later part itself, analyses the rank from its events file, and nothing is lost."""
    path = _plain(TWO_PARTS[0], tmp_path)
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    how = _in_two_parts(monkeypatch, 0.5)
    monkeypatch.setattr(sinks.sys, "executable", "/bin/false")
    _ingest(path, tmp_path / "parts", True, monkeypatch, analysed_in_chunks=False)
    assert how == ["here"]
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


def test_a_cut_inside_an_event_reads_the_trace_in_one_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event whose args hold a list of objects that read as events: the cut is found
    inside it, the first part then does not end with a whole event, and the trace is read in
    one piece instead (the same events as a whole read)."""
    path = _plain(TWO_PARTS[0], tmp_path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    fake = {"ph": "X", "cat": "cpu_op", "name": "fake", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    middle = len(events) // 2
    host = next(e for e in events[middle:] if e.get("cat") == "cpu_op")
    host.setdefault("args", {})["nested"] = [fake] * 400  # thousands of bytes of look-alikes
    text = json.dumps(trace, indent=1)
    path.write_text(text)
    inside = text.index('"nested"') + 2000
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    how = _in_two_parts(monkeypatch, inside / len(text.encode()))
    _ingest(path, tmp_path / "parts", True, monkeypatch)
    assert how == ["one piece"]
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


@pytest.mark.parametrize("where", ["header", "trailer"])
def test_a_cut_outside_the_events_reads_the_trace_in_one_piece(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys before or after the events array that hold objects reading as events (a hostile
    trace): a cut found among them is not a cut in the events; the trace is read in one
    piece, as a whole read reads it."""
    path = _plain(TWO_PARTS[0], tmp_path)
    trace = json.loads(path.read_text())
    fake = {"ph": "X", "cat": "cpu_op", "name": "fake", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    events = trace.pop("traceEvents")
    size = len(json.dumps(events))
    padding = [fake] * (2 * size // len(json.dumps(fake)))  # twice the events' bytes
    if where == "header":  # (the sniffer looks for "traceEvents" in the first 64 KB)
        trace = {**trace, "note": {"traceEvents": 0}, "decoys": padding, "traceEvents": events}
        at = 0.3
    else:
        trace = {**trace, "traceEvents": events, "decoys": padding}
        at = 0.8
    text = json.dumps(trace, indent=1)
    assert (text.index('"decoys"') < text.index('"traceEvents": [')) == (where == "header")
    path.write_text(text)
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    how = _in_two_parts(monkeypatch, at)
    _ingest(path, tmp_path / "parts", True, monkeypatch)
    assert how == ["one piece"]
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


def test_no_helper_process_can_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter cannot be started again (gone, no process left to this user): the trace
    is read in one piece and analysed on a thread, and nothing is lost."""
    path = _plain(TWO_PARTS[0], tmp_path)
    _ingest(path, tmp_path / "whole", False, monkeypatch)
    how = _in_two_parts(monkeypatch, 0.5)
    monkeypatch.setattr(sinks.sys, "executable", str(tmp_path / "no-such-python"))
    threads: list[int] = []
    real = sinks.InThread.__init__

    def background(self: sinks.InThread, sink: object) -> None:
        threads.append(1)
        real(self, sink)  # type: ignore[arg-type]

    monkeypatch.setattr(sinks.InThread, "__init__", background)
    _ingest(path, tmp_path / "parts", True, monkeypatch)
    assert how == ["one piece"] and threads == [1]
    _assert_same_run(tmp_path / "whole", tmp_path / "parts")


# --- a reader's recompute: every rank a chunk at a time, whatever wrote it ------------------

RECOMPUTED = {
    name.removeprefix("report-"): [Path(p) for p in argv[2:]]
    for name, argv in {**SAMPLE_CASES, **shared_cases()}.items()
    if argv[0] == "report"
}


@pytest.mark.parametrize("inputs", RECOMPUTED.values(), ids=RECOMPUTED.keys())
def test_a_readers_recompute_in_chunks_equals_the_ingests_tables(
    inputs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an analysis change a reader recomputes each rank's tables from its events file a
    chunk of steps at a time (``readback.analyse_written``), for runs of every framework and format
    (TensorFlow, MXNet and Chainer traces are read whole at ingest): the tables must be the
    ones the ingest wrote, rank by rank."""
    from traceview.analysis import rank_tables
    from traceview.ingest.large.readback import analyse_written

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        m.chdir(REPO)
        ingest_run(inputs, run, jobs=1)
    ranks = R.event_ranks(run)
    assert ranks
    for rank in ranks:
        side = {"memory": R.read_side(run, "memory", [rank])}
        tables = analyse_written(run, rank, rank_tables, side)
        assert tables is not None, f"rank {rank} not recomputed in chunks"
        for name in RANK_TABLES:
            written = R.read_table(run / f"{name}.parquet").filter(
                pc.equal(R.read_table(run / f"{name}.parquet").column(S.RANK), rank)
            )
            mine = S.conform(tables[name], written.schema)
            assert _columns(mine) == _columns(written), f"rank {rank}: {name}.parquet differs"
