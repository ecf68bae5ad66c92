"""A run's finished report, kept in its run directory (``REPORT_CACHE``) for the next plain
``report``: read back and rendered without opening the run's tables (nor importing pyarrow or
polars) where nothing it was computed from has changed since.

What it was computed from is the run as it is on disk (``fingerprint``): every manifest (less
the analysis version a reader stamps), the name, size and modification time of every other
file (the cached tables included) but the kept report and critical paths, and the traceview
code that computed it. A file replaced,
added, grown or removed anywhere in the run (a rank's events from another run, a step record a
job still writes, a new profile window), or another traceview, and the report is computed
again. A link anywhere in the run is not looked through: no kept report is used or written."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from traceview.model.results import RunReport

REPORT_CACHE = "report.cache.json"
_MANIFEST = "manifest.json"
#: What a report writes into a run (or a profile window of one) that differs from report to
#: report, never part of what one is computed from: this file, and the critical paths of other
#: choices of steps (runs/cache.py's PATH_CACHE). The cached tables are: a report that computes
#: them again (a damaged one, another analysis) keeps no report, the next one does.
_WRITTEN = frozenset({REPORT_CACHE, "critical_path.cache.json"})
#: A kept report larger than this is not read back (a damaged or foreign file).
_MOST_BYTES = 512 << 20


def _code() -> str:
    """The traceview that computes reports: its version and every module's size and time."""
    import traceview

    root = Path(traceview.__file__).parent
    seen = [traceview.__version__]
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            found = os.stat(os.path.join(folder, name))
            seen.append(
                f"{os.path.relpath(folder, root)}/{name}:{found.st_size}:{found.st_mtime_ns}"
            )
    return "\n".join(seen)


def _manifest(path: str) -> bytes | None:
    """A manifest's content less the analysis version (a reader that recomputes the cached
    tables stamps it); None where it is not a JSON object."""
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read())
    except (OSError, ValueError, RecursionError):  # (a nesting bomb: the reader says which)
        return None
    if not isinstance(doc, dict):
        return None
    doc.pop("analysis_version", None)
    return json.dumps(doc, sort_keys=True, default=str).encode()


def fingerprint(run: Path) -> str | None:
    """What the report of ``run`` is computed from, as it is now (module docstring); None where
    the run cannot be looked at whole (a link, a folder that cannot be listed)."""
    digest = hashlib.sha256(_code().encode())
    files: list[tuple[str, int, int]] = []
    folders = [str(run)]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
            is_run = any(e.name == _MANIFEST for e in entries)
            for entry in entries:
                if entry.is_symlink():
                    return None
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                    continue
                relative = os.path.relpath(entry.path, run)
                if is_run and entry.name == _MANIFEST:
                    content = _manifest(entry.path)
                    if content is None:
                        return None
                    digest.update(relative.encode() + b"\0" + content + b"\0")
                    continue
                if is_run and entry.name in _WRITTEN:
                    continue
                found = entry.stat(follow_symlinks=False)
                files.append((relative, found.st_size, found.st_mtime_ns))
        except OSError:
            return None
    digest.update(json.dumps(sorted(files)).encode())
    return digest.hexdigest()


class _Kept(msgspec.Struct, array_like=True):
    key: str  # fingerprint and the report's options
    report: msgspec.Raw  # (decoded as a RunReport only where the key matches)
    crc: int = -1  # the report's bytes' CRC-32 as written: they are printed as they are


def key_of(run: Path, top: int) -> str | None:
    """The key a report of ``run`` with ``top`` operators is kept under (None: not kept)."""
    found = fingerprint(run)
    return None if found is None else f"{found}:top={top}"


def _kept(run: Path, top: int) -> tuple[_Kept | None, str | None]:
    """The kept report of ``run`` with ``top`` operators where its key is the run's as it is
    now (else None: absent, stale, damaged or odd), and that key (None: it cannot be kept)."""
    key = key_of(run, top)
    if key is None:
        return None, None
    path = run / REPORT_CACHE
    try:
        found = os.lstat(path)
        if not stat.S_ISREG(found.st_mode) or found.st_size > _MOST_BYTES:
            return None, key
        with open(path, "rb") as fh:
            kept = msgspec.json.decode(fh.read(), type=_Kept)
    except (OSError, RecursionError, msgspec.DecodeError, msgspec.ValidationError):
        return None, key
    return (kept if kept.key == key else None), key


def _decoded(kept: _Kept, shown: Path) -> RunReport | None:
    from traceview.model.results import RunReport

    try:
        report = msgspec.json.decode(kept.report, type=RunReport)
    except (RecursionError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    report.run = msgspec.structs.replace(report.run, path=str(shown))
    return report


def look(run: Path, top: int, shown: Path) -> tuple[RunReport | None, str | None]:
    """The kept report of ``run`` with ``top`` operators where it is current (else None), its
    run's path as the user wrote it (``shown``); and the run's key as it is now (None: it
    cannot be kept), for ``write`` once a report is computed."""
    kept, key = _kept(run, top)
    return (None if kept is None else _decoded(kept, shown)), key


class _Head(msgspec.Struct):
    run: msgspec.Raw  # (a report's first field: the rest is not decoded)


_RUN_FIELD = b'{"run":'


def look_json(run: Path, top: int, shown: Path) -> tuple[str | None, str | None]:
    """As ``look``, the report as ``Result.to_json`` encodes it: the kept bytes with the run's
    path replaced, not decoded into structs (60 MB for 100,000 steps). The key says they are
    this code's report of the run as it is now, their CRC that they are the bytes ``write``
    encoded from it; any other kept report (edited, damaged) is decoded whole, as ``look``
    does."""
    kept, key = _kept(run, top)
    if kept is None:
        return None, key
    report = memoryview(kept.report)
    if zlib.crc32(report) == kept.crc and (spliced := _spliced(report, shown)) is not None:
        return spliced, key
    decoded = _decoded(kept, shown)
    return (None if decoded is None else decoded.to_json().decode()), key


def _spliced(report: memoryview, shown: Path) -> str | None:
    """``report`` with its run's path replaced by ``shown``; None where the report does not
    begin with its run as msgspec encodes one (or ``shown`` is no UTF-8)."""
    from traceview.model.results import RunInfo

    try:
        head = memoryview(msgspec.json.decode(report, type=_Head).run)
        rest = len(_RUN_FIELD) + len(head)
        if report[: len(_RUN_FIELD)] != _RUN_FIELD or report[len(_RUN_FIELD) : rest] != head:
            return None
        info = msgspec.structs.replace(msgspec.json.decode(head, type=RunInfo), path=str(shown))
        return b"".join((_RUN_FIELD, msgspec.json.encode(info), report[rest:])).decode()
    except (RecursionError, UnicodeError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def write(run: Path, top: int, report: RunReport, key: str | None) -> None:
    """Keep ``report`` in ``run`` where the run is as it was before it was computed (``key``,
    from ``look`` or ``key_of``); a run that cannot be written keeps none (only a cache)."""
    from traceview.model.errors import OutputError
    from traceview.store import rundir as R

    if key is None or key_of(run, top) != key:
        return
    encoded = report.to_json()
    # (as _Kept, written a piece at a time: the report is not copied again)
    head = b"[" + msgspec.json.encode(key) + b","
    tail = b"," + str(zlib.crc32(encoded)).encode() + b"]"
    try:
        with R.atomic_path(run / REPORT_CACHE, make_parent=False) as tmp, open(tmp, "wb") as fh:
            fh.writelines((head, encoded, tail))
    except (OutputError, OSError):
        pass
