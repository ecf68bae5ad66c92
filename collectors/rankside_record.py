"""The step record: every step of the run on every rank, profiled or not, and what the rank was
doing when it stopped (standard library only).

Under ``traceview collect`` each rank keeps, in its folder ``raw/rank-NNNNN/``:

- ``steps.bin``: one 40-byte row per step the job ran (the first is step 0), written as the step
  ends into a memory-mapped file grown ``STEP_CHUNK`` rows at a time (the rows not yet written
  are zeros): a mapped page belongs to the kernel's page cache, so what was written survives a
  killed process, and a step costs no system call; the watchdog thread writes the new rows back
  every ``FLUSH_S`` (one write per rank and flush, however short the steps: 1,024 ranks do not
  load a shared file system with a write per step);
- ``calls.bin``: a memory-mapped ring of the last ``CALLS`` collective and point-to-point calls
  the script made through ``torch.distributed`` (op, process group, the group's sequence number
  of the call, bytes, start, end: 0 while the call runs), and a header saying where the rank is
  now (its step, its phase, since when). A mapped page belongs to the kernel's page cache: what
  was written survives SIGKILL;
- ``groups.json``: the process groups' names by the number the calls carry;
- ``stacks.json``: every thread's Python stack (and ``fr.json``: PyTorch's Flight Recorder,
  where it is on) when the rank stalls (no step ended and no call made or finished for
  ``stall_s``), when the launcher ends it (SIGTERM, SIGINT) and when it raises.

Writing a call costs two ``struct.pack_into`` on the map (about 1 us); a step, one write.
Readers (``traceview/ingest/record.py``) treat every byte as untrusted. All times are UNIX ns
(``time.time_ns``), the status's clock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import re
import stat
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

MAGIC_STEPS = b"TVSTEP01"
#: steps.bin grows by this many rows at a time (640 KiB)
STEP_CHUNK = 16384
#: how often the watchdog writes the new step rows back (seconds)
FLUSH_S = 0.5
MAGIC_CALLS = b"TVCALL01"
#: steps.bin: magic, then rows of (step, calls, start_ns, end_ns, io_ns, comm_ns): comm_ns is the
#: step's time blocked in the calls it made (returned handles not counted)
STEP_ROW = struct.Struct("<IIqqqq")
#: calls.bin's header: magic, capacity, pid, calls written ever, step now, phase now (an index
#: into PHASES), the phase's start, the last progress (a step, a call begun or ended)
CALLS_HEAD = struct.Struct("<8sIIqIIqq")
HEAD_SIZE = 64
#: a call: start_ns, end_ns (0: running), bytes, group sequence number, step, group, op, flags
CALL_ROW = struct.Struct("<qqqIIHBBi")
CALLS = 8192

#: The ops a call carries, by index (one not here is "other").
OPS = (
    "other", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
    "gather", "scatter", "barrier", "send", "recv", "all_reduce_coalesced",
    "all_gather_coalesced",
)  # fmt: skip
#: Where a rank is (the header's phase): running its step, loading data, in a call.
PHASES = ("step", "io", "comm", "checkpoint")
IO_PHASE, CHECKPOINT_PHASE = PHASES.index("io"), PHASES.index("checkpoint")
#: flags: the call returned a handle (async_op, isend/irecv): its end is the return, not the
#: transfer's end; the call raised (a timeout, a peer gone)
ASYNC = 1
FAILED = 2
#: the byte offsets of a call's end and flags in its row, and of the header's count of calls
END_AT, FLAGS_AT, WRITTEN_AT = 8, 35, 16
_COUNT = struct.Struct("<q")

#: A rank that makes no progress for this long (seconds) has stalled: its stacks are written.
DEFAULT_STALL_S = 20.0


_SUFFIXES = ("_autograd", "_single", "_into_tensor", "_tensor")


def op_index(name: str) -> int:
    """The index in OPS of a torch.distributed function's name (``all_to_all_single_autograd``
    is an all_to_all)."""
    base, before = name, ""
    while base != before:
        before = base
        for suffix in _SUFFIXES:
            base = base.removesuffix(suffix)
    base = {"isend": "send", "irecv": "recv"}.get(base, base)
    return OPS.index(base) if base in OPS else 0


class Taken(Exception):
    """Another live process keeps this rank's record (a process the rank started, with its
    environment): this one keeps none."""


def _owner(calls: Path) -> int | None:
    """The pid in an existing calls.bin's header, where it is a live process's."""
    try:
        with open_regular(calls) as f:
            head = f.read(CALLS_HEAD.size)
        magic, _, pid, *_ = CALLS_HEAD.unpack(head)
        if magic != MAGIC_CALLS or pid == os.getpid():
            return None
        os.kill(pid, 0)
        return int(pid)
    except (OSError, struct.error, ValueError):
        return None


class StepRecord:
    """One rank's record (module docstring). Methods are cheap and never raise; in a process
    forked from the rank (a data-loader worker) they do nothing."""

    def __init__(self, folder: Path, stall_s: float = DEFAULT_STALL_S) -> None:
        self.folder = folder
        self.pid = os.getpid()
        self.stall_s = stall_s
        folder.mkdir(parents=True, exist_ok=True)
        if _owner(folder / "calls.bin") is not None:
            raise Taken(str(folder))
        with open(folder / "steps.bin", "w+b") as f:
            f.write(MAGIC_STEPS)
            f.truncate(len(MAGIC_STEPS) + STEP_CHUNK * STEP_ROW.size)
            self.steps_map = mmap.mmap(f.fileno(), 0)
        self.rows = 0  # step rows written
        self.flushed = 0  # of them, written back
        size = HEAD_SIZE + CALLS * CALL_ROW.size
        with open(folder / "calls.bin", "w+b") as f:
            f.truncate(size)
            self.map = mmap.mmap(f.fileno(), size)
        self.step = 0
        self.step_start = 0  # the step's start (0: nothing seen yet)
        self.step_calls = 0
        self.io_ns = 0
        self.comm_ns = 0  # the step's time blocked in calls so far
        self.written = 0  # calls written ever
        self.seq: dict[int, int] = {}  # group -> its calls so far
        self.groups: dict[str, int] = {}
        self.phase_now, self.phase_since = 0, time.time_ns()
        self.progress = self.phase_since
        self.lock = threading.Lock()
        self.dumped_stall = False
        self.ended = False
        self.owned = True
        with contextlib.suppress(AttributeError):
            os.register_at_fork(after_in_child=self._forked)
        self.raised: tuple[int, int] | None = None  # (step, phase) an exception left
        # profile windows asked of the job (RUN/requests, ``traceview profile``), oldest first;
        # the collector takes them at its step boundaries
        self.asked: list[dict[str, int]] = []
        self.requests = folder.parent.parent / REQUESTS
        self._requests_seen: set[str] = set()
        self._requests_mtime = 0
        self._head()

    def mine(self) -> bool:
        return self.owned

    def _forked(self) -> None:
        self.owned = False  # (a process forked from the rank: a data-loader worker)

    def _head(self) -> None:
        CALLS_HEAD.pack_into(
            self.map, 0, MAGIC_CALLS, CALLS, self.pid, self.written, self.step, self.phase_now,
            self.phase_since, self.progress,
        )  # fmt: skip

    def _begin(self, now: int) -> None:
        if not self.step_start:
            self.step_start = now

    # --- what the hooks call ------------------------------------------------------------------

    def step_end(self) -> None:
        """The step ended (the optimizer's step returned, or the script's ``step()``)."""
        if not self.mine():
            return
        now = time.time_ns()
        with self.lock:
            self._begin(now)
            at = len(MAGIC_STEPS) + self.rows * STEP_ROW.size
            with contextlib.suppress(OSError, ValueError):
                if at + STEP_ROW.size > len(self.steps_map):  # (grown a chunk: rarely)
                    self.steps_map.resize(len(self.steps_map) + STEP_CHUNK * STEP_ROW.size)
                STEP_ROW.pack_into(
                    self.steps_map, at, self.step, self.step_calls, self.step_start, now,
                    self.io_ns, self.comm_ns,
                )  # fmt: skip
                self.rows += 1
            self.step += 1
            self.step_start, self.step_calls, self.io_ns, self.comm_ns = now, 0, 0, 0
            self.progress = now
            self.dumped_stall = False
            self._head()

    def step_begin(self) -> None:
        """A step begins where the script says so (Keras' batch begin): the first step's start
        (a later step starts where the one before it ended)."""
        if not self.mine():
            return
        with self.lock:
            self._begin(time.time_ns())

    def group(self, name: str) -> int:
        """The number calls in the group ``name`` carry (groups.json written anew on a new one)."""
        found = self.groups.get(name)
        if found is None:
            found = self.groups[name] = len(self.groups)
            _write_json(self.folder / "groups.json", self.groups)
        return found

    def call_begin(self, op: int, group: int, nbytes: int, p2p: bool = False) -> int:
        """A call starts: returns its slot for ``call_end``. A collective carries its group's
        sequence number (from 1); a point-to-point call 0."""
        if not self.mine():
            return -1
        now = time.time_ns()
        with self.lock:
            self._begin(now)
            seq = 0
            if not p2p:
                seq = self.seq[group] = self.seq.get(group, 0) + 1
            slot = self.written % CALLS
            CALL_ROW.pack_into(
                self.map, HEAD_SIZE + slot * CALL_ROW.size, now, 0, nbytes, seq, self.step,
                group, op, 0, 0,
            )  # fmt: skip
            self.written += 1
            # (the header's count only: a reader takes the last progress from the rows too)
            _COUNT.pack_into(self.map, WRITTEN_AT, self.written)
            self.step_calls += 1
            self.progress = now
            self.dumped_stall = False
            return slot

    def call_end(self, slot: int, flags: int) -> None:
        """The call in ``slot`` returned (``flags``: ASYNC, FAILED)."""
        if slot < 0 or not self.mine():
            return
        now = time.time_ns()
        at = HEAD_SIZE + slot * CALL_ROW.size
        _COUNT.pack_into(self.map, at + END_AT, now)
        if flags:
            struct.pack_into("<B", self.map, at + FLAGS_AT, flags)
        if not flags & ASYNC:  # (blocked in it from its start: the step's comm)
            with self.lock:
                self.comm_ns += now - _COUNT.unpack_from(self.map, at)[0]
        self.progress = now

    def phase(self, index: int) -> int:
        """The rank enters phase ``index`` (PHASES); returns the phase it left, for ``restore``."""
        if not self.mine():
            return 0
        now = time.time_ns()
        with self.lock:
            self._begin(now)
            left = self.phase_now
            self.phase_now, self.phase_since = index, now
            self._head()
            return left

    def raised_in(self, index: int) -> None:
        """An exception left phase ``index`` (before ``restore``): where a rank that dies of
        it stood, for ``end``."""
        if self.mine():
            self.raised = (self.step, index)

    def restore(self, index: int) -> None:
        """The phase entered with ``phase`` ends: back to ``index``."""
        if not self.mine():
            return
        now = time.time_ns()
        with self.lock:
            if self.phase_now == 1:  # (data loading: its time counts in the step's row)
                self.io_ns += now - self.phase_since
            self.phase_now, self.phase_since = index, now
            self.progress = now
            self._head()

    # --- when the rank stops ----------------------------------------------------------------

    def end(self, state: str, detail: str | None) -> None:
        """How the process ends (ok, exception, signal): ``end.json``, the first said (an
        exception's exit handlers run after it), with the step it was in."""
        if not self.mine() or self.ended:
            return
        self.ended = True
        said = {"state": state, "detail": detail, "t_ns": time.time_ns(), "step": self.step,
                "pid": self.pid}  # fmt: skip
        if state == "exception" and self.raised is not None and self.raised[0] == self.step:
            said["phase"] = PHASES[self.raised[1]]  # (the phase it raised in, since left)
        self.flush()
        _write_json(self.folder / "end.json", said)

    def dump(self, reason: str, frame: Any = None, tb: Any = None) -> None:
        """Every thread's Python stack (``frame``: the main thread's, where a signal handler
        has it; ``tb``: where an exception was raised, for the main thread), and the Flight
        Recorder's entries where PyTorch records them. Never raises."""
        if not self.mine():
            return
        with contextlib.suppress(Exception):
            threads = {t.ident: t for t in threading.enumerate()}
            frames = sys._current_frames()
            main = threading.main_thread().ident
            if frame is not None and main is not None:
                frames[main] = frame
            me = threading.get_ident()
            stacks = []
            for ident, top in frames.items():
                if ident == me and frame is None and reason == "stall":
                    continue  # (the watchdog itself)
                thread = threads.get(ident)
                summary = traceback.extract_stack(top)
                if tb is not None and ident == main:
                    summary = traceback.extract_tb(tb)
                stacks.append(
                    {
                        "thread": thread.name if thread is not None else str(ident),
                        "main": ident == main,
                        "frames": [
                            {"file": f.filename, "line": f.lineno, "function": f.name,
                             "code": f.line or ""}
                            for f in summary[-40:]
                        ],
                    }
                )  # fmt: skip
            _write_json(
                self.folder / "stacks.json",
                {"reason": reason, "t_ns": time.time_ns(), "pid": self.pid, "step": self.step,
                 "threads": stacks},
            )  # fmt: skip
        with contextlib.suppress(Exception):
            self._dump_flight_recorder()

    def _dump_flight_recorder(self) -> None:
        if not os.environ.get("TORCH_FR_BUFFER_SIZE") or "torch" not in sys.modules:
            return
        c10d = sys.modules["torch"]._C._distributed_c10d
        dump = getattr(c10d, "_dump_fr_trace_json", None)
        if dump is not None:
            text = dump(True, True)
            _write_bytes(self.folder / "fr.json", text.encode() if isinstance(text, str) else text)

    def watch(self) -> None:
        """Start the watchdog: a daemon thread that dumps the stacks once per stall."""
        thread = threading.Thread(target=self._watch, name="traceview-watchdog", daemon=True)
        thread.start()

    def _watch(self) -> None:
        tick = min(ASK_TICK_S, self.stall_s / 4)
        flushed_at = time.monotonic()
        while True:
            time.sleep(tick)
            if not self.mine():
                return
            if not self.dumped_stall and time.time_ns() - self.progress > self.stall_s * 1e9:
                self.dumped_stall = True
                self.dump("stall")
            with contextlib.suppress(Exception):
                self._look_for_requests()
            if time.monotonic() - flushed_at >= FLUSH_S:
                flushed_at = time.monotonic()
                self.flush()

    def flush(self) -> None:
        """Write the step rows added since the last flush back to the file (for readers on
        other hosts; this host's see them at once). Never raises."""
        rows = self.rows
        if rows == self.flushed:
            return
        start = (len(MAGIC_STEPS) + self.flushed * STEP_ROW.size) // mmap.PAGESIZE * mmap.PAGESIZE
        end = len(MAGIC_STEPS) + rows * STEP_ROW.size
        with contextlib.suppress(OSError, ValueError):
            self.steps_map.flush(start, end - start)
            self.flushed = rows

    def _look_for_requests(self) -> None:
        """New profile requests (RUN/requests/profile-K.json): each read once, checked (they
        come from outside the job), queued in ``asked`` by window."""
        try:
            mtime = os.stat(self.requests).st_mtime_ns
        except OSError:
            return
        if mtime == self._requests_mtime:
            return
        self._requests_mtime = mtime
        new = []
        for name in sorted(os.listdir(self.requests))[:MAX_REQUESTS]:
            if name in self._requests_seen or not REQUEST_NAME.fullmatch(name):
                continue
            self._requests_seen.add(name)
            asked = read_request(self.requests / name)
            if asked is not None:
                new.append(asked)
        if new:
            with self.lock:
                taken = {a["window"] for a in self.asked}
                self.asked += [a for a in new if a["window"] not in taken]
                self.asked.sort(key=lambda a: a["window"])

    def take_request(self) -> dict[str, int] | None:
        """The oldest profile window asked and not yet taken (removed from the queue)."""
        if not self.asked:  # (the common case: one attribute read)
            return None
        with self.lock:
            return self.asked.pop(0) if self.asked else None


#: RUN/requests: the profile windows asked of the running job (``traceview profile``)
REQUESTS = "requests"
REQUEST_NAME = re.compile(r"profile-(\d{1,6})\.json")
#: the requests a rank reads at most (a flood of them costs it nothing more)
MAX_REQUESTS = 1000
#: how often a rank looks for requests (seconds; its watchdog's tick)
ASK_TICK_S = 0.25
#: a window's steps and warm-up at most
MAX_WINDOW_STEPS, MAX_WINDOW_WARMUP = 1000, 100


def open_regular(path: str | Path, buffering: int = -1) -> Any:
    """``path`` opened for reading where it is a regular file (a FIFO, socket or device is never
    waited on: OSError, as for a file that is not there)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_request(path: Path) -> dict[str, int] | None:
    """A profile request as its file says it, where it reads and its numbers are in range."""
    try:
        with open_regular(path) as f:
            said = json.loads(f.read(4096))
        asked = {k: said[k] for k in ("window", "start_step", "steps", "warmup")}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in asked.values()):
        return None
    if not (
        1 <= asked["window"] < 10**6
        and 0 <= asked["start_step"] < 2**31
        and 1 <= asked["steps"] <= MAX_WINDOW_STEPS
        and 0 <= asked["warmup"] <= MAX_WINDOW_WARMUP
    ):
        return None
    return asked


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _write_json(path: Path, data: Any) -> None:
    _write_bytes(path, json.dumps(data).encode())
