"""Errors that end a command with one line on stderr, and warnings that do not."""

from __future__ import annotations

from dataclasses import dataclass, field


class TraceviewError(Exception):
    """A failure the user can fix; the CLI prints ``str(self)`` and exits with ``exit_code``."""

    exit_code = 2


class UsageError(TraceviewError):
    """The command line asks for something that cannot be done."""


class BadInput(TraceviewError):
    """A trace or run directory cannot be read."""


class OutputError(TraceviewError):
    """Where a result goes cannot take it: a full or read-only file system, a file-size limit,
    a file where a folder should be."""


def _errno(exc: OSError) -> int | None:
    import re

    if exc.errno is not None:
        return exc.errno
    # Arrow's OSError gives the errno only in its text: "[errno 27] ..."
    found = re.search(r"\[errno (\d+)\]", str(exc))
    return int(found.group(1)) if found else None


def no_room(exc: OSError) -> bool:
    """Whether a write failed for want of room: a full disk or quota, a file-size limit, a
    read-only file system (the place, not the data)."""
    import errno

    return _errno(exc) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def cannot_write(path: object, exc: OSError) -> OutputError:
    """One line naming what could not be written and the system's reason."""
    import os

    code = _errno(exc)
    reason = os.strerror(code) if code else (exc.strerror or str(exc))
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    return OutputError(f"{path}: cannot write: {reason}{where}")


@dataclass
class Notes:
    """Warnings and remarks collected while reading or analysing a run.

    ``warnings`` are problems with the data (a truncated trace, missing ranks); ``remarks`` explain
    how a result was obtained (no step markers, so the whole trace is one window). Both end up in
    the manifest and the report.
    """

    warnings: list[str] = field(default_factory=list)
    remarks: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def remark(self, message: str) -> None:
        if message not in self.remarks:
            self.remarks.append(message)

    def extend(self, other: Notes) -> None:
        for message in other.warnings:
            self.warn(message)
        for message in other.remarks:
            self.remark(message)
