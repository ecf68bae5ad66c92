"""Inputs that loop or block: a loop of symbolic links given as the argument (or above it), a
FIFO, a socket or a device where a trace or a run directory's file should be. Only regular files
are opened (a FIFO would block the reader forever); anything else is a clean error where it was
named, and a note where it was found in a folder. Each run ends in exit 0 or 2, with one line
on stderr for 2, well within its time bound.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, Result, run_cli

SAMPLE = SAMPLES / "pytorch" / "ddp"
#: A blocked reader would wait forever: every run must end well before this.
BOUND_S = 60


def _run(*args: str | Path) -> Result:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "traceview", *map(str, args)],
            capture_output=True, text=True, timeout=BOUND_S,
            env={**os.environ, "COLUMNS": "120"},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"traceview {' '.join(map(str, args))} blocked past {BOUND_S} s")
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _one_line(result: Result, fragment: str) -> None:
    assert result.code == 2, (result.code, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceview: error: "), result.err
    assert fragment in lines[0], lines[0]


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    return tmp_path / "loop1"


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    made: list[socket.socket] = []

    def make(path: Path) -> Path:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        made.append(sock)
        return path

    yield make
    for sock in made:
        sock.close()


LOOP_COMMANDS = ("report", "report --json", "ingest", "compare")
LOOP_PLACES = ("argument", "parent")


@pytest.mark.parametrize(
    ("command", "where"), [("report", "argument"), ("ingest", "parent")]
)  # tests/fuzz/test_input_places.py: every pair
def test_a_loop_of_links_is_a_clean_error(
    command: str, where: str, loop: Path, tmp_path: Path
) -> None:
    check_loop(command, where, loop, tmp_path)


def check_loop(command: str, where: str, loop: Path, tmp_path: Path) -> None:
    path = loop if where == "argument" else loop / "rank-0.json"
    args: list[str | Path] = {
        "report": ["report", path],
        "report --json": ["report", path, "--json"],
        "ingest": ["ingest", path, "-o", tmp_path / "run"],
        "compare": ["compare", SAMPLE, path],
    }[command]
    result = _run(*args)
    assert result.code == 2, result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert "internal error" not in result.err and "Traceback" not in result.err


def test_a_fifo_named_as_a_trace_is_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "rank-0.pt.trace.json"
    os.mkfifo(fifo)
    _one_line(_run("report", fifo), "a FIFO, not a trace file; not opened")


def test_special_files_in_a_folder_are_named_and_skipped(
    tmp_path: Path, unix_socket: Callable[[Path], Path]
) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(SAMPLE, folder)
    os.mkfifo(folder / "rank-9.pt.trace.json")
    unix_socket(folder / "rank-8.pt.trace.json")
    (folder / "self").symlink_to(".")  # a loop through a folder link: not walked forever
    result = _run("report", folder, "--json")
    assert result.code == 0, result.err
    assert result.json()["run"]["ranks"] == 2
    assert "rank-9.pt.trace.json (a FIFO)" in result.out
    assert "rank-8.pt.trace.json (a socket)" in result.out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert run_cli("ingest", SAMPLE, "-o", out).code == 0
    return out


def _with_fifo_events(run_dir: Path, tmp_path: Path, stale: bool) -> Path:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    events = run / "events" / "rank=1" / "part-0.parquet"
    events.unlink()
    os.mkfifo(events)
    if stale:  # the cached tables gone: the reader recomputes from the events
        (run / "steps.parquet").unlink()
    return run


@pytest.mark.parametrize("stale", [False, True], ids=["cached", "recomputed"])
def test_a_fifo_for_a_run_directorys_events_is_never_opened(
    run_dir: Path, tmp_path: Path, stale: bool
) -> None:
    run = _with_fifo_events(run_dir, tmp_path, stale)
    report = _run("report", run, "--json")
    if stale:  # the rank is left out, and said so; the other is reported
        assert report.code == 0, report.err
        data = report.json()
        assert [r["rank"] for r in data["ranks"]] == [0]
        assert "a FIFO" in report.out + report.err
    else:  # the cache is current: the events are not needed
        assert report.code == 0, report.err
    # export leaves the rank out as report does, and says so (issue 36's smaller truths)
    for args in (["--format", "chrome", "-o", tmp_path / "t.json"], ["-o", tmp_path / "tables"]):
        result = _run("export", run, *args)
        assert result.code == 0, result.err
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and "rank 1's events left out" in lines[0], result.err
        assert "a FIFO" in lines[0]


def test_export_leaves_a_damaged_rank_out_as_report_does(run_dir: Path, tmp_path: Path) -> None:
    """One rank's events damaged: export writes the others and names it; every rank damaged:
    one line, exit 2."""
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "events" / "rank=1" / "part-0.parquet").write_bytes(b"not parquet")
    result = _run("export", run, "-o", tmp_path / "tables")
    assert result.code == 0, result.err
    assert "rank 1's events left out" in result.err
    events = pq.read_table(tmp_path / "tables" / "events.parquet")
    assert set(events.column("rank").to_pylist()) == {0}
    (run / "events" / "rank=0" / "part-0.parquet").write_bytes(b"not parquet")
    _one_line(_run("export", run, "-o", tmp_path / "again"), "unreadable")


def test_many_damaged_files_are_counted_not_listed(tmp_path: Path) -> None:
    """30 damaged traces beside a good run: the report names the first few and counts the
    rest; its JSON keeps every one."""
    folder = tmp_path / "traces"
    shutil.copytree(SAMPLE, folder)
    for i in range(30):
        damaged = '{"schemaVersion": 1, "distributedInfo": {"rank": %d}, "traceEvents": 5}'
        (folder / f"rank-{100 + i}.pt.trace.json").write_text(damaged % (100 + i))
    text = _run("report", folder)
    assert text.code == 0, text.err
    lines = [line for line in text.out.splitlines() if line.startswith("warning: ")]
    assert len(lines) <= 11, lines
    assert any("more warnings (report --json lists them all)" in line for line in lines), lines
    data = _run("report", folder, "--json").json()
    assert len([w for w in data["warnings"] if "traceEvents" in w]) == 30, data["warnings"]
