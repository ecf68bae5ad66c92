"""Where output goes is checked before any work starts: every command that writes (``ingest
-o``, ``collect -o``, ``export -o`` as tables or as one Chrome trace) against every kind of
place that cannot take it (a file where a folder should be, a FIFO, a device, a dangling link,
a loop of links, a path under a file, a name too long, a pseudo-file system, a name that is not
UTF-8, a folder of other files, ``/``). Each run ends in exit 0 or 2 with one line on stderr,
replaces no special file, touches nothing beside the place named, and ``collect`` never starts
the job it cannot keep the results of. A Chrome trace written to ``/dev/null`` or a FIFO is
written there, not in its place.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli

SAMPLE = SAMPLES / "pytorch" / "ddp"


def _regular(root: Path) -> Path:
    (root / "afile").write_text("keep me\n")
    return root / "afile"


def _fifo(root: Path) -> Path:
    os.mkfifo(root / "fifo")
    return root / "fifo"


def _dangling(root: Path) -> Path:
    (root / "dangling").symlink_to(root / "nowhere")
    return root / "dangling"


def _loop(root: Path) -> Path:
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    return root / "loop1"


def _under_a_file(root: Path) -> Path:
    return _regular(root) / "sub"


def _under_a_loop(root: Path) -> Path:
    return _loop(root) / "sub"


def _too_long(root: Path) -> Path:
    return root / ("n" * 300)


def _just_too_long(root: Path) -> Path:
    """A name the file system takes, but not with the hidden name a run or a file is first
    written as (beside it, then renamed)."""
    return root / ("n" * 250)


def _not_utf8(root: Path) -> Path:
    return root / os.fsdecode(b"bad\xffname")


def _others(root: Path) -> Path:
    (root / "folder").mkdir()
    (root / "folder" / "thesis.tex").write_text("not ours\n")
    return root / "folder"


def _link_to_dev_null(root: Path) -> Path:
    (root / "null").symlink_to("/dev/null")
    return root / "null"


def _link_to_others(root: Path) -> Path:
    (root / "link").symlink_to(_others(root))
    return root / "link"


#: Each hostile place, made under a fresh folder, and whether writing there can ever succeed
#: (None: never; otherwise the commands that may write there).
PLACES: dict[str, tuple[Callable[[Path], Path], set[str]]] = {
    "regular file": (_regular, {"chrome"}),
    "fifo": (_fifo, {"chrome"}),
    "/dev/null": (lambda root: Path("/dev/null"), {"chrome"}),
    "dangling link": (_dangling, set()),
    "symlink loop": (_loop, set()),
    "under a file": (_under_a_file, set()),
    "under a loop": (_under_a_loop, set()),
    "name too long": (_too_long, set()),
    "name too long to build in": (_just_too_long, {"parquet"}),
    "/proc": (lambda root: Path("/proc/traceview-out"), set()),
    "not UTF-8": (_not_utf8, set()),
    "folder of other files": (_others, set()),
    "/": (lambda root: Path("/"), set()),
    "link to /dev/null": (_link_to_dev_null, {"chrome"}),
    "link to a folder of other files": (_link_to_others, set()),
    "/sys": (lambda root: Path("/sys/kernel/traceview-out"), set()),
}

COMMANDS = ("ingest", "collect", "parquet", "chrome")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert run_cli("ingest", SAMPLE, "-o", out).code == 0
    return out


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root`` (links not followed): its mode, size and mtime."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            found[str(path)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def _special(path: Path) -> int | None:
    """The mode of ``path`` where it is a device or a FIFO (None otherwise, or unreadable)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    return mode if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) else None


def _restore_dev_null() -> None:
    """Put /dev/null back as the character device it is (root only; elsewhere it could not
    have been replaced)."""
    os.unlink("/dev/null")
    os.mknod("/dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod("/dev/null", 0o666)


def _command(what: str, out: Path, run: Path, marker: Path) -> list[str | Path]:
    if what == "ingest":
        return ["ingest", SAMPLE, "-o", out]
    if what == "collect":
        job = f"open({str(marker)!r}, 'w').close()"
        return ["collect", "-o", out, "--", sys.executable, "-c", job]
    return ["export", run, "--format", what, "-o", out]


#: The places this tier tries with every command (tests/fuzz/test_output_paths.py: all of them):
#: one written in place, one that can never be a folder, one a name too long, one not ours.
SAMPLE_PLACES = ("fifo", "under a file", "name too long", "folder of other files")


@pytest.mark.parametrize("place", SAMPLE_PLACES)
@pytest.mark.parametrize("what", COMMANDS)
def test_an_output_place_is_checked_before_any_work(
    what: str, place: str, run_dir: Path, tmp_path: Path
) -> None:
    check_output_place(what, place, run_dir, tmp_path)


def check_output_place(what: str, place: str, run_dir: Path, tmp_path: Path) -> None:
    """``what`` (a command of COMMANDS) writing to ``place`` (of PLACES) ends in exit 0 where
    the place can take it, else in one line and exit 2 before any work; it replaces no special
    file and changes nothing beside the place named."""
    make, writable = PLACES[place]
    root = tmp_path / "root"
    root.mkdir()
    out = make(root)
    marker = tmp_path / "job-ran"
    before = _snapshot(root)
    special = _special(out)
    reader: threading.Thread | None = None
    received: list[int] = []
    if special is not None and stat.S_ISFIFO(special) and what == "chrome":
        # someone reads the pipe, as a user would
        reader = threading.Thread(target=lambda: received.append(len(out.read_bytes())))
        reader.start()
    result = run_cli(*_command(what, out, run_dir, marker))
    if reader is not None:
        if result.code != 0:  # (unblock the reader: nothing was written)
            with out.open("wb"):
                pass
        reader.join(30)
    if what in writable:
        assert result.code == 0, result.err
    else:
        assert result.code == 2, (result.code, result.err)
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("traceview: error: "), result.err
        assert "Traceback" not in result.err and "internal error" not in result.err
    if special is not None:  # written to, never replaced
        replaced = out.lstat().st_mode != special
        if replaced and out == Path("/dev/null"):
            _restore_dev_null()  # (a regression must not leave the machine without one)
        assert not replaced, f"{out} was replaced"
    if received:
        assert received[0] > 1000  # the whole trace went through the pipe
    if what == "collect" and result.code == 2:
        assert not marker.exists(), "the job was launched anyway"
    after = _snapshot(root)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    allowed = str(out) if what in writable else None
    assert all(p == allowed or p.startswith(f"{allowed}{os.sep}") for p in changed), changed


def test_a_previous_export_of_every_table_is_replaced(tmp_path: Path) -> None:
    """A GPU run's export (launch grains, the critical path: every table export writes) into the
    folder of its previous export is written again, not refused as a folder of other files."""
    run = tmp_path / "run"
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "pytorch" / "gpu_sync"
    assert run_cli("ingest", sample, "-o", run).code == 0
    out = tmp_path / "tables"
    first = run_cli("export", run, "-o", out)
    assert first.code == 0, first.err
    written = {p.name for p in out.iterdir()}
    assert {"launches_by_phase.parquet", "critical_path.parquet"} <= written, written
    again = run_cli("export", run, "-o", out)
    assert again.code == 0, again.err
    assert {p.name for p in out.iterdir()} == written


def test_a_previous_export_is_replaced_and_a_default_link_not_followed(
    run_dir: Path, tmp_path: Path
) -> None:
    """An export folder that holds a previous export is written again; the default Chrome
    trace inside a run directory is not written through a link that leads out of it."""
    out = tmp_path / "tables"
    assert run_cli("export", run_dir, "-o", out).code == 0
    again = run_cli("export", run_dir, "-o", out)
    assert again.code == 0, again.err
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = run_dir / "trace.json.gz"
    link.symlink_to(victim)
    try:
        result = run_cli("export", run_dir, "--format", "chrome")
        assert result.code == 2 and "symbolic link" in result.err, result.err
        assert victim.read_text() == "keep me\n" and link.is_symlink()
    finally:
        link.unlink()
