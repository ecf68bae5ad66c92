"""Hostile and odd traces (issue 14): every case is a real sample or shared trace, mutated here.

Each ends in exit 0 with the damage named in one warning (the good events and ranks kept), or
in exit 2 with one line naming the file; never an internal error, a Python warning on stderr,
or memory that follows what a file claims rather than what it holds.
"""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
import zlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES, Result, run_cli, shared_traces

PT = SAMPLES / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz"
MX = SAMPLES / "mxnet" / "dist_sync" / "rank-0.mxnet.json.gz"
TF1 = "tensorflow/tf1_timeline_mnist_mlp_cpu/timeline_03_merged_5_runs.json.gz"

WIDE = 2**70  # wider than 64 bits
#: Peak memory a report of one small trace may reach, whatever the file claims: the samples
#: themselves take about 190 MB (Python, pyarrow, numpy); the reader's buffer adds at most
#: 4 MB + EVENT_LIMIT (64 MB), and inflating gzip 2 MB blocks.
MAX_RSS_MB = 512


@cache
def _document(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


@cache
def _steps(path: Path) -> int:
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    return int(result.json()["run"]["steps"])


def _tf1() -> Path:
    return shared_traces(TF1)


def _mutated(
    tmp_path: Path, sample: Path, change: Callable[[dict[str, Any]], None], name: str = ""
) -> Path:
    """The sample with ``change(document)`` applied, written as plain JSON."""
    document = copy.deepcopy(_document(sample))
    change(document)
    path = tmp_path / (name or sample.name.removesuffix(".gz"))
    path.write_text(json.dumps(document))
    return path


def _timed(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in document["traceEvents"] if e.get("ph") == "X"]


def _clean(result: Result) -> None:
    """No traceback, internal error or Python warning reached the user."""
    for noise in ("Traceback", "internal error", "Warning:"):
        assert noise not in result.err, result.err


def _report(path: Path) -> dict[str, Any]:
    result = run_cli("report", path, "--json")
    _clean(result)
    assert result.code == 0, result.err
    report: dict[str, Any] = result.json()
    return report


def _warning(report: dict[str, Any], *fragments: str) -> str:
    found = [w for w in report["warnings"] if all(f in w for f in fragments)]
    assert len(found) == 1, (fragments, report["warnings"])
    return found[0]


def _peak_rss_mb(*args: str | Path) -> tuple[int, float, str]:
    """Run the CLI; return its exit code, peak resident memory (MB) and stderr. Its address
    space is capped at 6 GB, so that a regression fails here rather than exhausting the
    machine."""

    # Linux carries a process's peak RSS over fork and exec, so a child of this (large, late in
    # a full run) test process would report at least the test process's size: the CLI is
    # forked from a small launcher instead, whose own peak is that of a bare interpreter.
    proc = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    code, maxrss_kb = json.loads(proc.stdout.strip().splitlines()[-1])
    return code, maxrss_kb / 1024, proc.stderr


_LAUNCHER = """
import json, os, resource, sys
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.execv(sys.executable, [sys.executable, "-m", "traceview", *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))
"""


# --- 1. integers wider than 64 bits ----------------------------------------------------------


def test_wide_ids_and_sizes_in_kineto_args(tmp_path: Path) -> None:
    def widen(document: dict[str, Any]) -> None:
        events = [e for e in _timed(document) if isinstance(e.get("args"), dict)]
        middle = events[len(events) // 2 :]
        middle[0]["args"]["External id"] = WIDE
        middle[1]["args"]["correlation"] = WIDE + 1
        middle[2]["args"]["bytes"] = WIDE
        middle[3]["args"]["external id"] = -WIDE

    path = _mutated(tmp_path, PT, widen)
    report = _report(path)
    assert report["run"]["steps"] == _steps(PT)
    _warning(report, path.name, "message size(s) too large for 64 bits")


@pytest.mark.parametrize("value", [WIDE, 10**10, -1], ids=["wide", "absurd", "negative"])
def test_absurd_rank_in_the_header_is_ignored_with_a_warning(tmp_path: Path, value: int) -> None:
    path = _mutated(tmp_path, PT, lambda d: d["distributedInfo"].update(rank=value))
    report = _report(path)
    _warning(report, path.name, "the rank the trace states", "ignored")
    assert [r["rank"] for r in report["ranks"]] == [0]  # from its order, as without a rank
    assert report["run"]["steps"] == _steps(PT)


@pytest.mark.parametrize("value", [WIDE, 10**10, 10**7], ids=["wide", "1e10", "1e7"])
def test_world_size_claims_cost_no_memory(tmp_path: Path, value: int) -> None:
    """A header claiming 10**10 ranks used to allocate per claimed rank (killed for memory)."""
    path = _mutated(tmp_path, PT, lambda d: d["distributedInfo"].update(world_size=value))
    code, rss, err = _peak_rss_mb("report", path, "--json")
    assert code == 0, err
    assert rss < MAX_RSS_MB, f"peak {rss:.0f} MB"
    report = _report(path)
    _warning(report, path.name, "the world size the trace states", "ignored")
    assert report["run"]["world_size"] is None and report["run"]["missing_ranks"] == []


@pytest.mark.parametrize("sample", [PT, MX], ids=["kineto", "mxnet"])
def test_step_number_too_large_is_numbered_by_position(tmp_path: Path, sample: Path) -> None:
    huge = "9" * 30

    def corrupt(document: dict[str, Any]) -> None:
        prefix = "ProfilerStep#" if sample is PT else "step#"
        events = document["traceEvents"]
        first = next(e["name"] for e in events if str(e.get("name")).startswith(prefix))
        for event in events:  # both records of a begin/end pair
            if event.get("name") == first:
                event["name"] = prefix + huge

    report = _report(_mutated(tmp_path, sample, corrupt))
    _warning(report, "step number too large", huge[:20])
    assert report["run"]["steps"] == _steps(sample)
    assert all(row["step"] < 2**53 for row in report["per_step"])


@pytest.mark.parametrize("field", ["pid", "tid"])
def test_wide_thread_ids_in_a_tf1_timeline(tmp_path: Path, field: str) -> None:
    tf1 = _tf1()

    def widen(document: dict[str, Any]) -> None:
        if field == "tid":
            for event in _timed(document)[10:20]:
                event["tid"] = WIDE
            return
        # a whole process (its name record and its events) gets a pid wider than 64 bits
        events = document["traceEvents"]
        pid = next(e["pid"] for e in events if "Compute" in str(e.get("args", {}).get("name")))
        for event in events:
            if event.get("pid") == pid:
                event["pid"] = WIDE

    report = _report(_mutated(tmp_path, tf1, widen))
    assert report["run"]["steps"] == _steps(tf1)


@pytest.mark.parametrize(
    "value", ["abc", WIDE, 1e30, -5, [1]], ids=["string", "wide", "float", "negative", "list"]
)
def test_kineto_base_time_of_wrong_type_or_size_is_not_used(tmp_path: Path, value: Any) -> None:
    path = _mutated(tmp_path, PT, lambda d: d.update(baseTimeNanoseconds=value))
    report = _report(path)
    _warning(report, path.name, "baseTimeNanoseconds", "not used")
    assert report["run"]["steps"] == _steps(PT)


# --- 2. nesting too deep for the decoder -----------------------------------------------------


def _deep(document: dict[str, Any]) -> None:
    """An event in the middle gets an argument nested 100,000 deep (written by hand below)."""
    events = [e for e in document["traceEvents"] if e.get("ph") in ("X", "B")]
    events[len(events) // 2].setdefault("args", {})["deep"] = "@DEEP@"


@pytest.mark.parametrize("sample", [PT, MX, "tf1"], ids=["kineto", "mxnet", "tf1"])
def test_deep_nesting_loses_only_the_event_that_holds_it(tmp_path: Path, sample: Any) -> None:
    sample = _tf1() if sample == "tf1" else sample
    path = _mutated(tmp_path, sample, _deep)
    path.write_text(path.read_text().replace('"@DEEP@"', "[" * 100_000 + "]" * 100_000))
    report = _report(path)
    _warning(report, path.name, "nested more than", "byte")
    assert report["run"]["steps"] >= _steps(sample) - 1


# --- 3. status.json written by the job -------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"rank": WIDE}, "rank"),
        ({"rank": 5_000_000_000}, "rank"),
        ({"rank": "one"}, "rank"),
        ({"world_size": 10**10}, "world_size"),
        ({"world_size": WIDE}, "world_size"),
        ({"world_size": [2]}, "world_size"),
        ({"clock": {"offset_ns": WIDE, "method": "tcp"}}, "clock.offset_ns"),
        ({"clock": {"offset_ns": 9 * 10**18, "method": "tcp"}}, "clock.offset_ns"),
        ({"clock": {"offset_ns": "soon", "method": "tcp"}}, "clock.offset_ns"),
    ],
)
def test_status_fields_of_wrong_type_or_size_are_dropped(
    tmp_path: Path, status: dict[str, Any], field: str
) -> None:
    folder = tmp_path / "rank-00000"
    folder.mkdir()
    (folder / MX.name).write_bytes(MX.read_bytes())
    (folder / "status.json").write_text(json.dumps(status))
    if field == "world_size":
        code, rss, err = _peak_rss_mb("report", folder, "--json")
        assert code == 0, err
        assert rss < MAX_RSS_MB, f"peak {rss:.0f} MB"
    report = _report(folder)
    warning = _warning(report, "status.json", field)
    assert "wrong type or out of range" in warning
    assert report["run"]["steps"] == _steps(MX)
    assert [r["rank"] for r in report["ranks"]] == [0]


# --- 4. times and durations far out ----------------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "field"),
    [(PT, "dur"), (PT, "ts"), (MX, "ts"), ("tf1", "dur"), ("tf1", "ts")],
    ids=["kineto-dur", "kineto-ts", "mxnet-ts", "tf1-dur", "tf1-ts"],
)
def test_absurd_times_are_dropped_with_a_warning(tmp_path: Path, sample: Any, field: str) -> None:
    """Durations of 10**18 µs gave "0 steps" and a numpy RuntimeWarning on stderr."""
    sample = _tf1() if sample == "tf1" else sample

    def corrupt(document: dict[str, Any]) -> None:
        events = [e for e in document["traceEvents"] if e.get("ph") in ("X", "B", "E")]
        for event in events[len(events) // 2 :][:7]:
            event[field] = 1e18

    path = _mutated(tmp_path, sample, corrupt)
    report = _report(path)
    _warning(report, path.name, "7 event(s) with ts or dur beyond ±2**52 µs", "not read")
    assert report["run"]["steps"] >= _steps(sample) - 1


@pytest.mark.parametrize("sample", [PT, MX, "tf1"], ids=["kineto", "mxnet", "tf1"])
def test_a_number_beyond_float_range_loses_only_its_record(tmp_path: Path, sample: Any) -> None:
    """One ``1e999`` (no float holds it) lost the whole file: exit 2, "no complete event"."""
    sample = _tf1() if sample == "tf1" else sample

    def mark(document: dict[str, Any]) -> None:
        events = [e for e in document["traceEvents"] if e.get("ph") in ("X", "B")]
        events[len(events) // 2]["ts"] = "@TS@"

    path = _mutated(tmp_path, sample, mark)
    path.write_text(path.read_text().replace('"@TS@"', "1e999"))
    report = _report(path)
    _warning(report, path.name, "1 record(s)", "out of range", "not read")
    assert report["run"]["steps"] >= _steps(sample) - 1


def test_every_time_absurd_is_one_line_and_exit_2(tmp_path: Path) -> None:
    def corrupt(document: dict[str, Any]) -> None:
        for event in document["traceEvents"]:
            if "ts" in event:
                event["ts"] = 1e18

    path = _mutated(tmp_path, PT, corrupt)
    result = run_cli("report", path)
    _clean(result)
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1
    assert path.name in result.err and "corrupt" in result.err


# --- 5. memory bombs -------------------------------------------------------------------------


def _bomb(tmp_path: Path, name: str, head: bytes, filler: bytes, gib: int = 1) -> Path:
    """A small .gz: ``head``, then ``gib`` GiB of ``filler`` (64 MiB gzip members, each
    compressed once and repeated)."""
    member = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = member.compress(filler * (64 << 20)) + member.flush()
    path = tmp_path / name
    with path.open("wb") as f:
        f.write(gzip.compress(head))
        for _ in range(16 * gib):
            f.write(block)
    return path


def _head_of(sample: Path, timed: int = 300) -> bytes:
    """The sample's header, metadata records and first ``timed`` complete events, as JSON
    that stops after the last event (the events array left open)."""
    document = dict(_document(sample))
    events = document.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    text = json.dumps({**document, "traceEvents": meta + _timed({"traceEvents": events})[:timed]})
    return text[: text.rindex("]")].encode()


@pytest.mark.parametrize(
    ("filler", "after"),
    [(b" ", b""), (b"\0", b""), (b"a", b', {"ph": "X", "name": "'), (b"[", b", ")],
    ids=["spaces", "zeros", "endless-name", "open-brackets"],
)
def test_gzip_bombs_are_read_in_bounded_memory(tmp_path: Path, filler: bytes, after: bytes) -> None:
    """A 1 MB .gz holding real events and then 1 GiB of padding grew the reader's buffer to
    the padding's size (2.5 GiB of it: 2.8 GB, and minutes)."""
    path = _bomb(tmp_path, "rank-0.pt.trace.json.gz", _head_of(PT) + after, filler)
    assert path.stat().st_size < 4 << 20
    code, rss, err = _peak_rss_mb("report", path, "--json")
    assert code == 0, err
    assert rss < MAX_RSS_MB, f"peak {rss:.0f} MB"
    report = _report(path)
    _warning(report, path.name, "no event boundary in 64 MB after byte", "kept 300 events")


def test_a_bomb_after_the_events_keeps_every_event(tmp_path: Path) -> None:
    """Keys after the events array were read whole however long: 1 GiB of padding there took
    that much memory. Now the events are all kept (the last step too: nothing was cut)."""
    text = json.dumps(_document(PT))
    end = text.rindex("]")
    head = text[:end] + '], "x": "' + "a" * (5 << 20) + '", "y": [{}, {}'
    path = _bomb(tmp_path, "rank-0.pt.trace.json.gz", head.encode(), b" ")
    code, rss, err = _peak_rss_mb("report", path, "--json")
    assert code == 0, err
    assert rss < MAX_RSS_MB, f"peak {rss:.0f} MB"
    report = _report(path)
    _warning(report, path.name, "the keys after the events array are too long")
    assert report["run"]["steps"] == _steps(PT)


def test_a_string_full_of_event_separators_is_no_hang(tmp_path: Path) -> None:
    """A name holding 8 MB of "}, {" made the reader try a cut (a decode of megabytes) at every
    one of them: minutes of CPU for a 10 MB file. The event is valid JSON and is kept."""

    def name(document: dict[str, Any]) -> None:
        events = _timed(document)
        events[len(events) // 2]["name"] = "@NAME@"

    path = _mutated(tmp_path, PT, name)
    path.write_text(path.read_text().replace('"@NAME@"', '"' + "}, {" * (2 << 20) + '"'))
    proc = subprocess.run(
        [sys.executable, "-m", "traceview", "report", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["run"]["steps"] == _steps(PT)


# --- 6. TF1 Timeline -------------------------------------------------------------------------


def test_tf1_event_of_wrong_type_loses_only_that_event(tmp_path: Path) -> None:
    tf1 = _tf1()

    def corrupt(document: dict[str, Any]) -> None:
        ops = [e for e in _timed(document) if e["args"].get("name") != "_SOURCE"]
        ops[len(ops) // 2]["args"]["name"] = 5
        ops[len(ops) // 2 + 1]["pid"] = "one"

    path = _mutated(tmp_path, tf1, corrupt)
    report = _report(path)
    _warning(report, path.name, "2 record(s) with a field of the wrong type", "not read")
    assert report["run"]["steps"] == _steps(tf1)


def test_tf1_with_its_metadata_past_the_sniffed_head_is_a_trace(tmp_path: Path) -> None:
    tf1 = _tf1()

    def metadata_last(document: dict[str, Any]) -> None:
        events = document["traceEvents"]
        meta = [e for e in events if e.get("ph") == "M"]
        document["traceEvents"] = [e for e in events if e.get("ph") != "M"] + meta

    path = _mutated(tmp_path, tf1, metadata_last)
    assert path.read_bytes().index(b"Compute") > 1 << 16
    report = _report(path)
    assert report["run"]["framework"] == "tensorflow"
    assert report["run"]["steps"] == _steps(tf1)


def test_xplane_step_number_wider_than_64_bits(tmp_path: Path) -> None:
    """A TensorFlow profile whose step_num stat is a uint64 above 2**63 (OverflowError in the
    step table before)."""
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    sample = SAMPLES / "tensorflow" / "explicit" / "rank-0.xplane.pb"
    space = xplane_pb2.XSpace()
    space.ParseFromString(sample.read_bytes())
    changed = 0
    for plane in space.planes:
        step_num = [k for k, v in plane.stat_metadata.items() if v.name == "step_num"]
        for event in (e for line in plane.lines for e in line.events):
            for stat in event.stats:
                if stat.metadata_id in step_num and changed < 1:
                    stat.uint64_value = 2**64 - 5
                    changed += 1
    assert changed == 1
    path = tmp_path / "rank-0.xplane.pb"
    path.write_bytes(space.SerializeToString())
    report = _report(path)
    _warning(report, path.name, "step number too large", "18446744073709551611")
    assert report["run"]["steps"] == _steps(sample)


def test_xplane_ids_wider_than_int64(tmp_path: Path) -> None:
    """correlation_id/group_id stats that are uint64 above 2**63 in the shared GPU profile
    (OverflowError before): they keep their 64 bits, so links and groups survive."""
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    (sample,) = shared_traces("tensorflow/tfprofiler_gpu_multi_worker").glob("*.xplane.pb")
    space = xplane_pb2.XSpace()
    space.ParseFromString(sample.read_bytes())
    changed = 0
    for plane in space.planes:
        ids = [
            k for k, v in plane.stat_metadata.items() if v.name in ("correlation_id", "group_id")
        ]
        for event in (e for line in plane.lines for e in line.events):
            for stat in event.stats:
                if stat.metadata_id in ids and changed < 3:
                    stat.uint64_value = 2**64 - 5
                    changed += 1
    assert changed == 3
    path = tmp_path / sample.name
    path.write_bytes(space.SerializeToString())
    report = _report(path)
    assert report["summary"]["step_ms"] == _report(sample)["summary"]["step_ms"]
