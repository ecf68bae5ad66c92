"""Every registered parser, over every sample and shared trace it recognises, only reads: it
returns raw events in schema.RAW_SCHEMA, kinds only where the format states them, and names a
known layout or step-inference pass if it needs one (steps it does not read are the core's)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.conftest import SAMPLES, SHARED, for_unit, parser_of
from traceview.ingest.discover import RANK_STATUS
from traceview.model import schema as S
from traceview.normalize.step_inference import STEP_THREAD
from traceview.normalize.steps import LAYOUTS, STEP_INFERENCE
from traceview.parsers.kineto import KinetoParser


def _traces() -> list[Path]:
    roots = [SAMPLES, SHARED] if SHARED.exists() else [SAMPLES]
    found = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            suffix = path.name.endswith((".json.gz", ".json", ".xplane.pb"))
            # not traces: a run's ground truth, and collect's per-rank status (ingest skips it)
            if path.is_file() and suffix and path.name not in ("groundtruth.json", RANK_STATUS):
                found.append(path)
    return found


TRACES = _traces()


def _parser_returns_raw_events_and_nothing_decided(path: Path) -> None:
    parser = parser_of(path)
    assert parser is not None, f"{path}: no parser recognises it"
    parsed = parser.parse(path)
    events = parsed.events
    assert events.schema.equals(S.RAW_SCHEMA, check_metadata=False)
    assert events.num_rows > 0
    kinds = set(events.column(S.KIND).to_pylist())
    # kinds are the core's to decide (from categories); a parser states instants at most
    assert kinds <= {None, S.KIND_INSTANT}, f"{parser.name} decided kinds {kinds}"
    assert pc.min(events.column(S.DUR_NS)).as_py() >= 0
    assert parsed.layout is None or parsed.layout in LAYOUTS
    assert parsed.infer_steps is None or parsed.infer_steps in STEP_INFERENCE
    # a step group is what the file says of an event; only the core's pass makes steps of it
    if events.column(S.STEP_GROUP).null_count < events.num_rows:
        assert parsed.infer_steps == "step_groups"
    on_step_thread = pc.sum(pc.equal(events.column(S.TID), STEP_THREAD)).as_py()
    assert not on_step_thread, f"{parser.name} puts events on the core's step thread"
    assert parsed.framework == parser.framework


@pytest.mark.parametrize("path", for_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parser_returns_raw_events_and_nothing_decided(path: Path) -> None:
    _parser_returns_raw_events_and_nothing_decided(path)


def test_a_parser_of_the_old_protocol_is_bad_input_naming_it(tmp_path: Path) -> None:
    """A third-party parser still written as parse(path, rules) gets one clear error."""
    from traceview.ingest.rank import parse_with
    from traceview.model.errors import BadInput

    class OldParser:
        name = "someones-format"
        framework = "pytorch"

        def parse(self, path: Path, rules: object) -> object:
            raise AssertionError("not called")

    with pytest.raises(BadInput, match=r"someones-format.*parse\(path, rules\)"):
        parse_with(OldParser(), tmp_path / "x.json")  # type: ignore[arg-type]


def test_a_kineto_decode_error_is_not_hidden_by_the_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded shapes decode to Raw values that point into the reader's buffer: an error while
    a chunk's columns are built surfaces as itself, not as the BufferError of a buffer that
    cannot be released while the error's traceback holds them."""
    import gzip

    from traceview.parsers import kineto

    source = SAMPLES / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz"
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.decompress(source.read_bytes()))
    assert b'"Input Dims"' in path.read_bytes()

    def failing(*args: object) -> None:
        raise RuntimeError("failed while building the batch sizes")

    monkeypatch.setattr(kineto.chunk, "_leading_size", failing)
    with pytest.raises(RuntimeError, match="batch sizes"):
        kineto.KinetoParser().parse(path)


def test_a_profiler_that_keeps_frames_does_not_break_kineto_parsing() -> None:
    """A sampling profiler may hold a frame past its return, with its locals (Dask's workers
    run one: an ingest on a cluster failed with "BufferError: memoryview has 12 exported
    buffers"). Here a profile hook keeps every frame that built a chunk's columns, whose
    records hold Raw values of recorded shapes: the parse is the same as without it."""
    import sys

    from traceview.parsers import kineto

    path = SAMPLES / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz"
    plain = kineto.KinetoParser().parse(path).events
    kept: list[object] = []

    def keep(frame: object, event: str, arg: object) -> None:
        if event == "return" and frame.f_code.co_name == "_columns":  # type: ignore[attr-defined]
            kept.append(frame)

    sys.setprofile(keep)
    try:
        profiled = kineto.KinetoParser().parse(path).events
    finally:
        sys.setprofile(None)
    assert kept, "the hook saw no chunk being built"
    assert profiled.equals(plain)


# --- what a parser can do is part of the protocol, not a list of names in the core ------------


def test_every_built_in_parser_states_what_it_can_do() -> None:
    from traceview.parsers import generic, registered, rules_file_of, streams_of

    for parser in (*registered(), generic()):
        assert streams_of(parser) and callable(parser.stream), parser.name
        assert rules_file_of(parser) is None, parser.name


class _PluginParser:
    """A third-party parser as one was written before streaming: name, framework, sniff,
    identify and parse only."""

    name = "someones-format"
    framework = "pytorch"

    def sniff(self, path: Path, head: bytes) -> bool:
        return False

    def parse(self, path: Path) -> object:
        raise AssertionError("not called")


def test_a_parser_that_does_not_say_it_streams_is_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from traceview.ingest.large.chunked import wants_chunks
    from traceview.parsers import streams_of

    old = _PluginParser()
    assert not streams_of(old)  # type: ignore[arg-type]
    assert not wants_chunks(old)  # type: ignore[arg-type]
    says_so = _PluginParser()
    says_so.streams = True  # type: ignore[attr-defined]
    assert not streams_of(says_so), "streams without a stream() to read with"  # type: ignore[arg-type]
    says_so.stream = lambda path: iter(())  # type: ignore[attr-defined]
    assert wants_chunks(says_so)  # type: ignore[arg-type]
    monkeypatch.setenv("TRACEVIEW_WHOLE_RANK", "1")
    assert not wants_chunks(says_so)  # type: ignore[arg-type]


def test_a_parser_may_ship_the_rules_of_a_framework_traceview_does_not_know(
    tmp_path: Path,
) -> None:
    from traceview.model.errors import UsageError
    from traceview.normalize.rules import rules_for

    own = tmp_path / "myfw.toml"
    own.write_text(
        "framework = \"myfw\"\n[step]\npattern = '^iteration (\\d+)$'\n"
        '[[rule]]\nmatch = "^fwd_"\nphase = "forward"\n'
    )
    with pytest.raises(UsageError, match="no built-in rules for framework 'myfw'"):
        rules_for("myfw")
    rules = rules_for("myfw", own=own)
    assert rules.step_number("iteration 12") == 12
    assert rules.classify("op", None, "fwd_conv").phase == "forward"
    # the generic path's defaults still apply beneath them (chrome.toml: the phases' own regions)
    assert rules.classify("python", None, "backward").phase == "backward"
    # on a framework traceview ships rules for, a parser's own extend the built-in ones (as
    # --rules does: its step pattern replaces theirs, the rest adds to them)
    pytorch = rules_for("pytorch", own=own)
    assert pytorch.step_number("iteration 3") == 3
    assert pytorch.classify("op", None, "fwd_conv").phase == "forward"
    assert pytorch.default_op("aten::mm") == rules_for("pytorch").default_op("aten::mm") == "mm"


def _kineto_head(path: Path, records: list[str]) -> Path:
    op = '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 1, "dur": 2}'
    events = ",\n".join([*records, op])
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + events + "\n]}")
    return path


def test_kineto_names_the_process_it_labels_cpu_whatever_its_pid(tmp_path: Path) -> None:
    """A container numbers its processes from 1, as Kineto numbers its GPUs from 0: the host
    process is the one labelled "CPU", not the one with a large pid (GPU rows come first)."""
    gpus = [
        f'{{"ph": "M", "name": "process_labels", "pid": {d}, "tid": 0, '
        f'"args": {{"labels": "GPU{d}"}}}}'
        for d in range(8)
    ]
    cpu = '{"name": "process_labels", "args": {"labels": "CPU"}, "ph": "M", "pid": 7, "tid": 0}'
    labelled = _kineto_head(tmp_path / "labelled.json", [*gpus, cpu])
    assert KinetoParser().identify(labelled).process == 7
    # unlabelled: only a pid no device could have is taken for the process
    bare = _kineto_head(tmp_path / "bare.json", [])
    assert KinetoParser().identify(bare).process is None


@pytest.mark.skipif(not SHARED.exists(), reason=f"shared traces not found at {SHARED}")
@pytest.mark.parametrize(
    ("trace", "pid"),
    [  # the pid of the "CPU"-labelled process, read off each trace with zcat and grep
        ("pytorch/hta_nccl_parser_config/nccl_data.json.gz", 2910249),
        ("pytorch/kineto_resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz", 25738),
        ("pytorch/hta_cpu_only_gloo/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 1074),
    ],
)
def test_kineto_names_the_process_of_shared_traces(trace: str, pid: int) -> None:
    assert KinetoParser().identify(SHARED / trace).process == pid
