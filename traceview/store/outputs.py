"""Where a command's output may go, checked before any work starts (and before ``collect``
launches a job): one clear line and exit 2 for a place that cannot take it, never a traceback
halfway through, and never a special file or a folder of other files replaced.

- a **run directory** (``ingest -o``, ``collect -o``): absent, an empty folder, or (ingest only)
  a run directory, which is replaced whole;
- an **export folder** (``export --format parquet|csv -o``): absent, empty, or a previous export
  (only files export writes), never a folder holding anything else (``/`` included);
- an **export file** (``export --format chrome -o``): a regular file, replaced atomically, or a
  character device or FIFO (``/dev/null``, ``/dev/stdout``, a named pipe), written in place.

Every place is checked the same way first: a name that is valid UTF-8 (the manifest and the
report hold it), names and the path within the file system's limits (with the hidden sibling a
run is built in), no symbolic-link loop, every existing ancestor a folder, and the nearest
existing one writable (a file is made and removed there: this catches read-only file systems,
permissions and pseudo-file systems like ``/proc`` alike).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from traceview.model import schema as S
from traceview.model.errors import OutputError, UsageError, cannot_write
from traceview.model.escape import safe
from traceview.store import rundir as R

#: What an export folder may already hold: the files a previous export wrote.
EXPORT_TABLES = (
    "events", "steps", "ops", "collectives", "gpu", "launches", *S.SIDE_INPUTS, "memory_steps",
    "critical_path", "comm_by_group", "pipeline_stages", "launches_by_phase", "launches_by_rank",
)  # fmt: skip
EXPORT_FORMATS = ("parquet", "csv")


@dataclass(frozen=True)
class OutputFile:
    """Where an exported file goes: ``path`` to write, and whether it is a special file
    (character device, FIFO) written in place rather than replaced."""

    path: Path
    special: bool = False


def run_directory(path: Path, *, empty: bool = False) -> Path:
    """``path`` as the run directory a command will write (``empty``: it must be absent or an
    empty folder, as ``collect`` wants; otherwise a run directory there is replaced)."""
    whole = Path(os.path.abspath(path))
    if not whole.name:
        raise UsageError(f"{_name(path)}: cannot be a run directory (give a folder inside it)")
    _checked_place(path, sibling=R.staging_dir(whole).name)
    found = _existing(path)
    if found is None:
        return path
    if not stat.S_ISDIR(found.st_mode):
        raise UsageError(f"{_name(path)}: exists and is {_kind(found.st_mode)}, not a folder")
    if _names(path) and (empty or not R.is_run_dir(path)):
        what = "is not empty" if empty else "exists and is not a traceview run directory"
        raise UsageError(f"{_name(path)}: {what} (choose another -o)")
    if empty:  # written inside (collect's run), not replaced from beside it: probe inside too
        _probe(path, path)
    return path


def inside_run(path: Path, run: Path) -> None:
    """An output place inside the run directory ``run`` (by its name: the default export folder
    or file, or one given there) must stay inside it once symbolic links are followed: nothing
    in a run directory is followed out of it, for writing either."""
    whole, root = os.path.abspath(path), os.path.abspath(run)
    if os.path.commonpath([whole, root]) != root:
        return
    real = R.leads_out(run, path)
    if real is not None:
        raise UsageError(
            f"{_name(path)}: a symbolic link out of the run directory (to {_name(Path(real))}); "
            "not followed (give -o elsewhere)"
        )


def export_directory(path: Path) -> Path:
    """``path`` as the folder an export writes its tables into."""
    _checked_place(path)
    found = _existing(path)
    if found is None:
        return path
    if not stat.S_ISDIR(found.st_mode):
        raise UsageError(f"{_name(path)}: exists and is {_kind(found.st_mode)}, not a folder")
    ours = {f"{t}.{f}" for t in EXPORT_TABLES for f in EXPORT_FORMATS}
    entries = _names(path)
    others = sorted(e for e in entries if e not in ours and not e.startswith("."))
    hidden = sorted(e for e in entries if e.startswith(".") and not _our_temporary(e))
    if others or hidden:
        first = safe((others or hidden)[0])
        raise UsageError(
            f"{_name(path)}: holds other files ({first}…); export into an empty folder or a "
            "previous export's"
        )
    return path


def export_file(path: Path, *, follow: bool = True) -> OutputFile:
    """``path`` as the file an export writes; a symbolic link is followed where ``follow``
    (the user named it) and refused otherwise (a default place inside a run directory)."""
    # (a regular file is written beside itself first: ``rundir.atomic_path``'s temporary name)
    _checked_place(path, sibling=f".{path.name}.xxxxxxxx.tmp", probe=False)
    try:
        link = path.lstat()
    except FileNotFoundError:
        _probe(path, _nearest_existing(path.absolute().parent, path))
        return OutputFile(path)
    except OSError as exc:
        raise _unusable(path, exc) from None
    if stat.S_ISLNK(link.st_mode) and not follow:
        raise UsageError(f"{_name(path)}: is a symbolic link; not followed (give -o)")
    found = _existing(path)
    assert found is not None  # (lstat found it, and _existing refuses a dangling link)
    mode = found.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        if not os.access(path, os.W_OK):
            raise cannot_write(_name(path), PermissionError(errno.EACCES, "Permission denied"))
        return OutputFile(path, special=True)
    if stat.S_ISREG(mode):
        target = Path(os.path.realpath(path)) if stat.S_ISLNK(link.st_mode) else path
        _probe(target, target.parent)  # (replaced: a new file is made beside it)
        return OutputFile(target)
    raise UsageError(f"{_name(path)}: exists and is {_kind(mode)}, not a file")


# --- the checks every place gets ---------------------------------------------------------------


def _checked_place(path: Path, sibling: str | None = None, probe: bool = True) -> None:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{_name(path)}: not a valid UTF-8 name (the run records it): choose another"
        ) from None
    ancestor = _nearest_existing(path.absolute().parent, path)
    limit, total = _limits(ancestor)
    for part in (*path.parts, *([sibling] if sibling else [])):
        if len(os.fsencode(part)) > limit:
            raise UsageError(
                f"{_name(path)}: a name longer than the file system allows ({limit} bytes"
                + (", with the hidden name it is first written as)" if part == sibling else ")")
            )
    if len(os.fsencode(str(path.absolute()))) > total:
        raise UsageError(f"{_name(path)}: a path longer than the file system allows")
    if probe:
        _probe(path, ancestor)


def _nearest_existing(folder: Path, path: Path) -> Path:
    """The nearest ancestor of ``folder`` (itself included) that exists; it must be a folder
    (``path``: the output, for the message)."""
    for candidate in (folder, *folder.parents):
        try:
            found = candidate.stat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _unusable(candidate, exc) from None
        if not stat.S_ISDIR(found.st_mode):
            raise OutputError(
                f"{_name(path)}: cannot write: {_name(candidate)} is {_kind(found.st_mode)}, "
                "not a folder"
            )
        return candidate
    return Path(os.sep)


def _limits(folder: Path) -> tuple[int, int]:
    """The longest name and path the file system of ``folder`` takes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        return 255, 4096


def _probe(path: Path, ancestor: Path) -> None:
    """A file made and removed in the folder that will hold ``path`` (or its nearest existing
    ancestor): what cannot be written there fails here, before any work."""
    try:
        fd, name = tempfile.mkstemp(prefix=".traceview-probe-", dir=ancestor)
    except OSError as exc:  # (the probe's own name is not the user's business)
        raise cannot_write(_name(path), OSError(exc.errno, exc.strerror)) from None
    os.close(fd)
    os.unlink(name)


def _existing(path: Path) -> os.stat_result | None:
    """``path``'s status, links followed; None where nothing is there. A link to nothing is
    refused: writing through it would make a folder or file wherever it points."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise UsageError(f"{_name(path)}: a symbolic link to nothing (dangling)") from None
        return None
    except OSError as exc:
        raise _unusable(path, exc) from None


def _names(path: Path) -> list[str]:
    """The names in a folder, or a clean error where it cannot be listed."""
    try:
        return os.listdir(path)
    except OSError as exc:
        raise _unusable(path, exc) from None


def _our_temporary(name: str) -> bool:
    """A temporary file of an export cut short (``rundir.atomic_path``'s ``.NAME.*.tmp``)."""
    return name.endswith(".tmp") and any(
        name.startswith(f".{t}.{f}.") for t in EXPORT_TABLES for f in EXPORT_FORMATS
    )


def _unusable(path: Path, exc: OSError) -> UsageError | OutputError:
    if exc.errno == errno.ELOOP:
        return UsageError(f"{_name(path)}: a loop of symbolic links")
    if exc.errno == errno.ENAMETOOLONG:
        return UsageError(f"{_name(path)}: a name longer than the file system allows")
    if exc.errno == errno.ENOTDIR:
        return UsageError(f"{_name(path)}: a file stands where a folder should be")
    return cannot_write(_name(path), exc)


def _kind(mode: int) -> str:
    return "a file" if stat.S_ISREG(mode) else R.special_kind(mode)


def _name(path: Path) -> str:
    """``path`` for a message: untrusted (escapes, invalid UTF-8) made printable, and cut."""
    text = str(path).encode("utf-8", "backslashreplace").decode()
    return safe(text, 120)


def open_in_place(path: Path) -> IO[bytes]:
    """A special file (a device, a named pipe) opened for writing in place. A pipe with no
    reader is waited for as ``cat > fifo`` does, but a non-blocking open tried every 50 ms: a
    signal then ends the wait (a blocking open is restarted by a native library's handler that
    asks for it, and would outlive Ctrl-C)."""
    if not stat.S_ISFIFO(os.stat(path).st_mode):
        return path.open("wb")
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # (ENXIO: no reader yet)
                raise
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
