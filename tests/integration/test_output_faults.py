"""Where the output cannot go (a full device, a file-size limit, a file in the way, a read-only
folder): one line naming the file and the system's reason, exit 2; nothing half-written is left,
and a previous run at the target is kept (issue 14)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, Result, run_cli

DDP = SAMPLES / "pytorch" / "ddp"


def _limited(*args: str | Path, fsize: int, stdout: int | None = None) -> Result:
    """The CLI under a file-size limit (RLIMIT_FSIZE): writes past it fail with EFBIG."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    proc = subprocess.run(
        [sys.executable, "-m", "traceview", *map(str, args)],
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
        timeout=300,
    )
    return Result(proc.returncode, proc.stdout or "", proc.stderr)


def _one_line(result: Result, *fragments: str) -> None:
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "run"
    assert run_cli("ingest", DDP, "-o", out).code == 0
    return out


def test_ingest_past_a_file_size_limit_keeps_the_previous_run(tmp_path: Path, run: Path) -> None:
    target = tmp_path / "run"
    assert run_cli("ingest", DDP, "-o", target).code == 0
    before = run_cli("report", "--json", target).json()["summary"]
    result = _limited("ingest", DDP, "-o", target, fsize=20_000)
    _one_line(result, "cannot write: File too large", str(target / "events"))
    assert ".partial" not in result.err  # the target is named, not the staging folder
    assert run_cli("report", "--json", target).json()["summary"] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder left


@pytest.mark.parametrize("fmt", ["parquet", "csv", "chrome"])
def test_export_past_a_file_size_limit(tmp_path: Path, run: Path, fmt: str) -> None:
    out = tmp_path / ("trace.json.gz" if fmt == "chrome" else "out")
    result = _limited("export", run, "--format", fmt, "-o", out, fsize=20_000)
    _one_line(result, "cannot write: File too large")
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_report_when_its_scratch_space_is_too_small() -> None:
    _one_line(_limited("report", DDP, fsize=2_000), "cannot write: File too large")


def test_report_to_a_full_device() -> None:
    with open("/dev/full", "w") as full:
        result = _limited("report", "--json", DDP, fsize=1 << 40, stdout=full.fileno())
    _one_line(result, "output: cannot write: No space left on device")


def test_an_output_below_a_file(tmp_path: Path, run: Path) -> None:
    (tmp_path / "file").write_text("x")
    _one_line(run_cli("ingest", DDP, "-o", tmp_path / "file" / "run"), "cannot write")
    _one_line(run_cli("export", run, "-o", tmp_path / "file" / "out"), "cannot write")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        _one_line(run_cli("ingest", DDP, "-o", folder / "run"), "cannot write")
    finally:
        folder.chmod(0o755)


def _signals_as_in_a_terminal() -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("signame", "code", "times"),
    [("SIGTERM", 143, 1), ("SIGHUP", 129, 1), ("SIGINT", 130, 1), ("SIGTERM", 143, 2)],
)
def test_a_signal_while_traceview_works_exits_as_interrupted(
    tmp_path: Path, run: Path, signame: str, code: int, times: int
) -> None:
    """A Chrome export into a named pipe no one reads waits (as `cat > fifo` does; its --help
    says so): a signal then ends it with one line and 128 + the signal, nothing half-written
    left in the run directory; a second one as it ends (GNU timeout signals the process, then
    its group) changes nothing."""
    import signal
    import time

    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    before = sorted(p.name for p in run.iterdir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceview", "export", run, "--format", "chrome", "-o", fifo],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # (as a terminal's foreground job has them, where a background job of a shell that
        # runs the tests may have SIGINT ignored, and one started under nohup SIGHUP: traceview
        # then leaves them so, as it should)
        preexec_fn=_signals_as_in_a_terminal,
    )
    time.sleep(3)  # (it has opened the pipe and waits for a reader)
    assert proc.poll() is None, proc.communicate()
    for _ in range(times):
        proc.send_signal(signal.Signals[signame])
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"traceview: interrupted ({signame})"), err
    assert sorted(p.name for p in run.iterdir()) == before
    assert "named pipe" in run_cli("export", "--help").out
