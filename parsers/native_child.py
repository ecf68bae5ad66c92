"""Native code run in a child process, so that its death is one line, not traceview's.

xprof's converter is C++: where it fails a check (a thread it cannot start under an
address-space limit) it aborts the process, and a bad read may end in a segfault; in
traceview's own process that would end the command with no word (exit 134 or 139), its log
swallowed with the rest of what xprof writes to file descriptor 2. So on Linux the conversion
runs in a child forked for it (a few milliseconds: nothing is imported again), which hands
back what it made through a pipe; its death is reported as ``NativeDied``, with the fatal line
xprof logged. Elsewhere (no fork), and where a child cannot be started, it runs in process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import struct
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import IO

_PIECE, _DOC, _ERROR, _END = b"P", b"D", b"E", b"Z"
_HEAD = struct.Struct("<cQ")
_CHUNK = 1 << 22  # a text document is encoded and sent this many characters at a time
Doc = str | bytes | bytearray  # a document the work made, as read back


class NativeDied(Exception):
    """The child was ended by a signal (or exited without a word): what happened, one line."""


class NativeFailed(Exception):
    """The work raised a Python exception (in the child or in process): its message."""


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to file descriptor 2 (xprof logs its errors there)."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", "replace").splitlines())


#: Work this process does later anyway (imports), done the next time it waits for a child:
#: registered by the application (``while_waiting``), never by a parser.
_WAITING: dict[str, Callable[[], object]] = {}


def while_waiting(name: str, task: Callable[[], object]) -> None:
    """Have ``task`` done once, the next time this process waits for a child's work (its
    failure is left for the work itself to meet later)."""
    _WAITING[name] = task


def _waited() -> None:
    while _WAITING:
        task = _WAITING.pop(next(iter(_WAITING)))
        with contextlib.suppress(Exception):
            task()


def cores() -> int:
    """The cores this process may run on (its affinity: a job's cgroup or taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def forks() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def run(
    work: Callable[[], Iterable[str | bytes]], meanwhile: Callable[[], object] | None = None
) -> tuple[list[Doc], list[str]]:
    """``work()``'s documents and the lines native code logged on the way; in a child where
    this platform forks, ``meanwhile()`` run in this process while the child works (before the
    work where it runs in process). ``NativeDied`` where the child died, ``NativeFailed`` where
    the work raised."""
    if forks():
        try:
            return _in_child(work, meanwhile)
        except OSError:  # no child to be had (a process limit): in process
            pass
    if meanwhile is not None:
        meanwhile()
    with captured_stderr() as logged:
        try:
            docs: list[Doc] = list(work())
        except Exception as exc:
            raise NativeFailed(str(exc)) from None
    return docs, logged


def in_two(here: Callable[[], bytes], there: Callable[[], bytes]) -> tuple[bytes, bytes]:
    """``here()`` in this process and ``there()`` at the same time in one forked for it (on
    another core); ``there()`` run here after where no process can be forked or it died, or
    where this process may run on one core only."""
    if not forks() or cores() < 2:
        return here(), there()
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return here(), there()
    try:
        with warnings.catch_warnings():  # (3.12 warns of a fork beside other threads)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return here(), there()
    if pid == 0:  # pragma: no cover - the helper (its coverage is not collected)
        code = 0
        try:
            _die_with_parent()
            os.close(read_end)
            _write_all(write_end, there())
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(write_end)
    reaped = False
    try:
        mine = here()
        theirs = bytearray()
        while chunk := os.read(read_end, 1 << 20):
            theirs += chunk
        _, status = os.waitpid(pid, 0)
        reaped = True
    finally:
        os.close(read_end)
        if not reaped:
            _kill(pid)
    if status != 0:
        return mine, there()
    return mine, bytes(theirs)


class Child:
    """Work running in a child forked for it (``start``); ``finish`` takes what it made (or
    says how it failed), ``cancel`` ends it unheard."""

    def __init__(self, pid: int, read_end: int, log: IO[bytes]) -> None:
        self.pid, self.read_end, self.log = pid, read_end, log
        self.done = False

    def finish(self, meanwhile: Callable[[], object] | None = None) -> tuple[list[Doc], list[str]]:
        """The child's documents and what native code logged on the way (``meanwhile()`` run
        here while it works); ``NativeDied`` where it died, ``NativeFailed`` where the work
        raised."""
        assert not self.done, "a child's work is taken once"
        self.done = True
        reaped = False
        try:
            if meanwhile is not None:  # (the child blocks once the pipe is full, no sooner)
                meanwhile()
            _waited()
            docs, error = _receive(self.read_end)
            _, status = os.waitpid(self.pid, 0)
            reaped = True
        finally:
            os.close(self.read_end)
            if not reaped:  # interrupted (Ctrl-C) or the pipe broke: the child goes too
                _kill(self.pid)
            self.log.seek(0)
            logged = self.log.read().decode("utf-8", "replace").splitlines()
            self.log.close()
        if error is not None:
            raise NativeFailed(error)
        if os.WIFSIGNALED(status):
            raise NativeDied(_death(os.WTERMSIG(status), logged))
        if os.WEXITSTATUS(status) != 0 or docs is None:
            raise NativeDied(f"exited with code {os.WEXITSTATUS(status)}{_fatal(logged)}")
        return docs, logged

    def cancel(self) -> None:
        """The child ended and reaped, its work left (nothing where it was finished)."""
        if self.done:
            return
        self.done = True
        os.close(self.read_end)
        _kill(self.pid)
        self.log.close()


def start(work: Callable[[], Iterable[str | bytes]]) -> Child:
    """``work()`` begun in a child forked for it; OSError where no child can be had."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (the Child closes it)
    try:
        read_end, write_end = os.pipe()
    except OSError:
        log.close()
        raise
    with warnings.catch_warnings():  # (3.12 warns of a fork beside other threads)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            log.close()
            raise
    if pid == 0:  # pragma: no cover - the child (its coverage is not collected)
        os.close(read_end)
        _child(work, write_end, log.fileno())
    os.close(write_end)
    return Child(pid, read_end, log)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _in_child(
    work: Callable[[], Iterable[str | bytes]], meanwhile: Callable[[], object] | None
) -> tuple[list[Doc], list[str]]:
    return start(work).finish(meanwhile)


def _child(
    work: Callable[[], Iterable[str | bytes]], out: int, log: int
) -> None:  # pragma: no cover
    """Run ``work`` and send what it made; never return."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        _die_with_parent()
        faulthandler.disable()  # (a traceback of its death would reach the parent's stderr)
        os.dup2(log, 2)
        try:
            for doc in work():  # each sent as it is made
                _send_doc(out, doc)
        except Exception as exc:
            _send(out, _ERROR, (str(exc) or type(exc).__name__).encode("utf-8", "replace"))
        else:
            _send(out, _END, b"")
    except BaseException:
        code = 70
    finally:
        os._exit(code)


def _die_with_parent() -> None:  # pragma: no cover - the child's
    """The child ends with its parent, even a SIGKILLed one (Linux's PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _send(fd: int, kind: bytes, body: bytes) -> None:  # pragma: no cover - the child's
    _write_all(fd, _HEAD.pack(kind, len(body)))
    _write_all(fd, body)


def _send_doc(fd: int, doc: str | bytes) -> None:  # pragma: no cover - the child's
    """A document in pieces (a text one encoded a piece at a time, never whole), then its end."""
    for i in range(0, len(doc), _CHUNK):
        piece = doc[i : i + _CHUNK]
        _send(fd, _PIECE, piece.encode("utf-8") if isinstance(piece, str) else piece)
    _send(fd, _DOC, b"")


def _write_all(fd: int, data: bytes) -> None:  # pragma: no cover - the child's
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int) -> tuple[list[Doc] | None, str | None]:
    """The child's documents (None: it did not say it was done) or its error."""
    docs: list[Doc] = []
    doc = bytearray()
    while True:
        head = _read_exactly(fd, _HEAD.size)
        if head is None:
            return None, None
        kind, size = _HEAD.unpack(head)
        body = _read_exactly(fd, size)
        if body is None:
            return None, None
        if kind == _PIECE:
            doc += body
        elif kind == _DOC:
            docs.append(doc)  # (a bytearray: msgspec reads it as it is)
            doc = bytearray()
        elif kind == _ERROR:
            return None, body.decode("utf-8", "replace")
        else:
            return (docs if kind == _END else None), None


def _read_exactly(fd: int, size: int) -> bytearray | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            return None
        got += n
    return buf


def _death(number: int, logged: list[str]) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    hint = " (out of memory?)" if number == signal.SIGKILL else ""
    return f"killed by {name}{hint}{_fatal(logged)}"


def _fatal(logged: list[str]) -> str:
    """The fatal line xprof (absl) logged before it died: ``F0000 ... file.cc:93] Check failed:
    ...``, without its prefix; else nothing."""
    for line in reversed(logged):
        if line[:1] == "F" and line[1:5].isdigit() and "] " in line:
            text = line.split("] ", 1)[1].strip()
            text = "".join(c if c.isprintable() else " " for c in text)
            return f": {text[:300]}"
    return ""
