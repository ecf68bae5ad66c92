"""The integration tier's part of ``tests/unit/test_cli.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import SAMPLES, run_cli, shared_traces

DDP = SAMPLES / "pytorch" / "ddp"


def test_help_lists_the_commands() -> None:
    result = run_cli("--help")
    assert result.code == 0
    for command in ("ingest", "report", "export"):
        assert command in result.out


def test_report_json_contract() -> None:
    result = run_cli("report", DDP, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert report["run"]["framework"] == "pytorch"
    assert report["run"]["ranks"] == 2 and report["run"]["steps"] == 5
    summary = report["summary"]
    phases = {"io", "h2d", "forward", "backward", "update", "comm", "other", "idle"}
    assert set(summary["breakdown_ms"]) == phases
    for key in ("step_ms", "comm_total_ms", "comm_hidden_fraction", "bottleneck", "straggler_rank"):
        assert key in summary
    assert summary["bottleneck"] in {"io", "h2d", "forward", "backward", "update", "comm"}
    assert sum(summary["breakdown_ms"].values()) == pytest.approx(summary["step_ms"], abs=0.05)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert {
            "rank",
            "steps",
            "step_ms",
            "breakdown_ms",
            "comm_total_ms",
            "comm_hidden_fraction",
        } <= set(rank)
        assert set(rank["breakdown_ms"]) == phases


def test_report_text_tells_the_story() -> None:
    result = run_cli("report", SAMPLES / "pytorch" / "explicit")
    assert result.code == 0, result.err
    text = result.out
    assert "comm is the bottleneck" in text
    assert "hidden: no" in text
    assert "Per rank" in text and "Top operators" in text
    assert "allreduce" in text


def test_ingest_then_report_and_export(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = run_cli("ingest", DDP, "-o", run)
    assert result.code == 0, result.err
    assert (run / "manifest.json").is_file()
    assert (run / "events" / "rank=0" / "part-0.parquet").is_file()
    assert (run / "events" / "rank=1" / "part-0.parquet").is_file()
    assert pq.read_table(run / "steps.parquet").num_rows == 10
    # nothing half-written is left beside it
    assert [p.name for p in tmp_path.iterdir()] == ["run"]

    from_run = run_cli("report", run, "--json").json()
    from_traces = run_cli("report", DDP, "--json").json()
    assert from_run["summary"] == from_traces["summary"]

    result = run_cli("export", run, "--format", "chrome", "-o", tmp_path / "merged.json.gz")
    assert result.code == 0, result.err
    trace = json.loads(gzip.decompress((tmp_path / "merged.json.gz").read_bytes()))
    events = trace["traceEvents"]
    names = sorted(e["args"]["name"] for e in events if e.get("name") == "process_name")
    # a process per rank, and the critical path's own
    assert [n.split(" (")[0] for n in names] == ["rank 0", "rank 1", "traceview critical path"]
    steps = [e for e in events if e.get("cat") == "traceview"]
    assert len(steps) == 10 and all("breakdown_ms" in e["args"] for e in steps)
    assert min(e["ts"] for e in events if "ts" in e) >= 0

    for fmt in ("parquet", "csv"):
        result = run_cli("export", run, "--format", fmt, "-o", tmp_path / fmt)
        assert result.code == 0, result.err
        assert {p.name for p in (tmp_path / fmt).iterdir()} == {
            f"events.{fmt}",
            f"steps.{fmt}",
            f"ops.{fmt}",
            f"collectives.{fmt}",
            f"comm_by_group.{fmt}",  # (its all-reduces, by group and phase)
            f"critical_path.{fmt}",
        }


def _assert_one_line_error(result, *fragments: str) -> None:
    assert result.code == 2, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("empty.json", b"", "empty file"),
        ("notes.json", b"this is not json at all", "not a trace"),
        ("broken.json.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", "corrupt gzip"),
        ("other.json", json.dumps({"some": "document"}).encode(), "not a trace"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, name: str, content: bytes, fragment: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    _assert_one_line_error(run_cli("report", path), fragment)


def test_traces_of_other_tools_are_refused_clearly(tmp_path: Path) -> None:
    # a browser's Chrome trace: the format is right, the content is nobody's training run
    browser = tmp_path / "chrome-page-load.json"
    browser.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "blink", "name": "Layout", "pid": 1, "tid": 1, '
        '"ts": 1, "dur": 5}]}'
    )
    for path in (
        browser,
        shared_traces("mxnet/mxnet_profiler_demo_mnist_cnn/basic_nvprof_output.nvvp"),  # SQLite
    ):
        _assert_one_line_error(run_cli("report", path), "not a trace traceview can read")


def test_missing_paths_and_empty_folders(tmp_path: Path) -> None:
    _assert_one_line_error(run_cli("report", tmp_path / "nope"), "no such file or directory")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no traces here")
    _assert_one_line_error(run_cli("report", tmp_path / "empty"), "no traces found")
    result = run_cli("report")
    assert result.code == 2 and "Traceback" not in result.err


def test_truncated_trace_keeps_what_was_written(tmp_path: Path) -> None:
    data = gzip.decompress((DDP / "rank-1.pt.trace.json.gz").read_bytes())
    cut = int(len(data) * 0.6)
    (tmp_path / "rank-1.pt.trace.json").write_bytes(data[:cut])
    shutil.copy(DDP / "rank-0.pt.trace.json.gz", tmp_path)
    result = run_cli("report", tmp_path, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert report["run"]["ranks"] == 2
    (warning,) = [w for w in report["warnings"] if "damaged" in w]
    assert "rank-1.pt.trace.json" in warning and "lost" in warning
    lost = int(warning.split("lost ")[1].split(" bytes")[0].replace(",", ""))
    assert 0 < lost < len(data) - cut + 2000
    # the rank that died mid-write still reports the steps it completed before the cut
    rank1 = next(r for r in report["ranks"] if r["rank"] == 1)
    assert 1 <= rank1["steps"] <= 5


def test_missing_ranks_are_named(tmp_path: Path) -> None:
    shutil.copy(DDP / "rank-0.pt.trace.json.gz", tmp_path)
    result = run_cli("report", tmp_path, "--json")
    assert result.code == 0
    report = result.json()
    assert report["run"]["ranks"] == 1 and report["run"]["missing_ranks"] == [1]
    assert any("missing rank(s) 1" in w for w in report["warnings"])
    text = run_cli("report", tmp_path)
    assert "warning: world size 2 but 1 trace(s) given: missing rank(s) 1" in text.out


def test_failed_ingest_leaves_the_previous_run_untouched(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert run_cli("ingest", DDP, "-o", run).code == 0
    before = (run / "manifest.json").read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"")
    result = run_cli("ingest", bad, "-o", run)
    assert result.code == 2
    assert (run / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "run"]


def test_a_bug_in_the_analysis_is_still_an_internal_error(tmp_path: Path) -> None:
    """Bad input is exit 2, but exit 2 is no catch-all (issue 14): an analysis that breaks on good
    input (here the summary, broken on purpose in the child process) is exit 1, in one line that
    says so, with the traceback under TRACEVIEW_DEBUG=1."""
    import os
    import subprocess
    import sys

    script = (
        "import sys\n"
        "import traceview.analysis.summary as summary\n"
        "def broken(*args, **kwargs):\n"
        "    raise ZeroDivisionError('a bug planted by the test')\n"
        "summary.summarize = broken\n"
        "from traceview.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for debug in ("", "1"):
        env = {k: v for k, v in os.environ.items() if k != "TRACEVIEW_DEBUG"}
        if debug:
            env["TRACEVIEW_DEBUG"] = debug
        proc = subprocess.run(
            [sys.executable, "-c", script, "report", str(DDP)],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        if debug:
            assert "Traceback" in proc.stderr and "a bug planted by the test" in proc.stderr
        else:
            assert proc.stderr.strip().splitlines() == [
                "traceview: internal error: ZeroDivisionError: a bug planted by the test "
                "(set TRACEVIEW_DEBUG=1 for the traceback)"
            ]


def test_names_from_traces_cannot_drive_the_terminal(tmp_path: Path) -> None:
    data = json.loads(gzip.decompress((DDP / "rank-0.pt.trace.json.gz").read_bytes()))
    evil = "[b]x[/b]\x1b]0;pwned\x07\x1b[2J"
    for event in data["traceEvents"]:
        if event.get("name") == "aten::mm":
            event["name"] = evil
    (tmp_path / "rank-0.json").write_text(json.dumps(data))
    result = run_cli("report", tmp_path / "rank-0.json", "--top", "40")
    assert result.code == 0, result.err
    assert "\x1b" not in result.out and "\x07" not in result.out
    assert "\\x1b]0;pwned\\x07" in result.out  # shown, escaped
    assert "[b]x[/b]" in result.out  # shown literally, not interpreted as markup


# --- hostile records inside otherwise good traces (what a fuzzer found) --------------------------

HOSTILE_SAMPLES = [
    SAMPLES / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz",
    SAMPLES / "mxnet" / "dist_sync" / "rank-0.mxnet.json.gz",
]


def _trace_with(tmp_path: Path, sample: Path, change) -> tuple[Path, int]:
    """The sample with ``change(events)`` applied; returns the file and its step count."""
    document = json.loads(gzip.decompress(sample.read_bytes()))
    steps = run_cli("report", sample, "--json").json()["run"]["steps"]
    change([e for e in document["traceEvents"] if e.get("ph") != "M"])
    path = tmp_path / sample.name.removesuffix(".gz")
    path.write_text(json.dumps(document))
    return path, steps


@pytest.mark.parametrize("sample", HOSTILE_SAMPLES, ids=lambda p: p.parent.parent.name)
def test_invalid_utf8_in_a_name_loses_only_that_event(tmp_path: Path, sample: Path) -> None:
    path, steps = _trace_with(tmp_path, sample, lambda events: None)
    data = path.read_bytes()
    at = data.index(b'"name"', len(data) // 2) + len(b'"name": "')
    path.write_bytes(data[:at] + b"\xff\xfe" + data[at + 2 :])
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert any("invalid UTF-8" in w for w in report["warnings"]), report["warnings"]
    assert report["run"]["steps"] >= steps - 1


@pytest.mark.parametrize("sample", HOSTILE_SAMPLES, ids=lambda p: p.parent.parent.name)
def test_numbers_too_wide_for_64_bits_are_not_a_crash(tmp_path: Path, sample: Path) -> None:
    def widen(events: list[dict]) -> None:
        events[10]["pid"] = 2**70
        events[11]["tid"] = -(2**70)
        events[12]["ts"] = 2**70
        events[13]["dur"] = 2**70

    path, steps = _trace_with(tmp_path, sample, widen)
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    assert result.json()["run"]["steps"] == steps


def test_one_event_decades_away_is_dropped_not_fatal(tmp_path: Path) -> None:
    """MXNet writes epoch microseconds: one record at time 1 would stretch the trace over 56
    years (and no call tree can be built): it is dropped with a warning, the rest is read."""
    sample = SAMPLES / "mxnet" / "dist_sync" / "rank-0.mxnet.json.gz"

    def corrupt(events: list[dict]) -> None:
        next(e for e in events if e.get("ph") == "B")["ts"] = 1

    path, steps = _trace_with(tmp_path, sample, corrupt)
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert any("30 days" in w for w in report["warnings"]), report["warnings"]
    assert report["run"]["steps"] == steps


@pytest.mark.parametrize(
    "args",
    [
        ["report", "pytorch/ddp"],
        ["report", "pytorch/ddp", "--json"],
        ["report", "pytorch/ddp", "--all-ranks"],
        ["compare", "pytorch/ddp", "pytorch/explicit"],
    ],
    ids=["text", "json", "all-ranks", "compare"],
)
def test_a_reader_that_closed_the_pipe_is_not_an_error(args: list[str]) -> None:
    """``traceview report … | head -1``: the reader has what it wanted. Its end of the pipe is
    closed before traceview writes a byte, so every write fails; exit 0, nothing on stderr."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    paths = [str(SAMPLES / a) if "/" in a else a for a in args]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "traceview", *paths],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
