"""What `traceview collect` runs inside every process of the job: the rank-side runtime and
its entry points (standard library only).

`traceview collect` copies the rank-side modules (every ``rankside*.py``) into the run
directory as the package ``_traceview_rankside`` (whose ``__init__`` holds this module's entry
points: ``install``, ``current``, ``step``, ``phase``), next to a ``sitecustomize.py`` that
imports it and calls ``install()``, and puts that folder first on the job's PYTHONPATH. So every Python process of the job loads it at start-up without the training
script being edited, and without traceview having to be importable in the job's environment.

At start-up nothing happens but the installation of import hooks. When the process imports a
framework (torch, tensorflow, mxnet, chainer, jax), the hook starts that framework's collector
(``rankside_<module>.py``: a ``rankside_lifecycle.Collector``), which profiles a window of
steps and writes the trace to ``RUN/raw/rank-NNNNN/`` when the window ends or the process exits.
Processes that never step (a launcher's agent, data-loader workers) leave nothing behind.

What the collectors share lives here: the environment, the rank, the clock, the status, the
memory watch and cap, the import hook, the exit handlers, and the collectors the user API
(``traceview.collectors.step``/``phase``) reaches.

Nothing here may break the job: every failure prints one line prefixed ``traceview:`` on the
rank's stderr and the job runs on unprofiled.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.abc
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .rankside_record import DEFAULT_STALL_S

ENV_RUN_DIR = "TRACEVIEW_RUN_DIR"
ENV_STEPS = "TRACEVIEW_STEPS"
ENV_WARMUP = "TRACEVIEW_WARMUP"
ENV_SKIP = "TRACEVIEW_SKIP"
ENV_CLOCK = "TRACEVIEW_CLOCK"  # host:port of the launcher's clock service
ENV_NVTX = "TRACEVIEW_NVTX"  # "on", "off", or "auto": on when an NVTX tool (Nsight) is attached
#: "on" (the default) or "off": record the allocator's memory records (profile_memory=True)
ENV_PROFILE_MEMORY = "TRACEVIEW_PROFILE_MEMORY"
#: bytes the process's resident memory may grow by while it profiles; "0": no cap
ENV_MAX_MEMORY = "TRACEVIEW_MAX_PROFILE_MEMORY"
ENV_STALL = "TRACEVIEW_STALL_S"  # seconds without progress before a rank's stacks are written
DEFAULT_MAX_MEMORY = 2 << 30  # stopping needs several times more again: see README
NVTX_TOOL_VARIABLES = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH")

# --- who am I: rank, world size and local rank from the launcher's environment ---------------

#: (rank, world size, local rank) variables, in the order they are trusted. Open MPI, MPICH
#: and Intel MPI (PMI), PMIx launchers, Slurm, torchrun and friends, MVAPICH.
RANK_VARIABLES: tuple[tuple[str, str | None, str | None], ...] = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    source: str  # the variable the rank came from, or "default" for a single process


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def detect_rank(env: Mapping[str, str]) -> RankInfo:
    """The process's place in the job, from the first launcher whose variables are set."""
    for rank_var, size_var, local_var in RANK_VARIABLES:
        rank = _int(env.get(rank_var))
        if rank is None:
            continue
        size = _int(env.get(size_var)) if size_var else None
        local = _int(env.get(local_var)) if local_var else None
        if size is None and rank_var == "PMIX_RANK":
            size = _int(env.get("OMPI_COMM_WORLD_SIZE"))
        return RankInfo(
            rank,
            size if size is not None else rank + 1,
            local if local is not None else 0,
            rank_var,
        )
    return RankInfo(0, 1, 0, "default")


# --- clock: offset of this host's clock to the launcher's ------------------------------------


@dataclass
class ClockOffset:
    offset_ns: int = 0  # add to this process's time.time_ns() to get the launcher's clock
    uncertainty_ns: int | None = None  # half the best round trip
    method: str = "wallclock"  # "tcp" (probed against the launcher) or "wallclock" (assumed 0)
    probes: int = 0


def probe_clock(address: str | None, rounds: int = 16, timeout: float = 2.0) -> ClockOffset:
    """Cristian's algorithm against the launcher: keep the round trip with the smallest delay."""
    if not address:
        return ClockOffset()
    host, _, port = address.rpartition(":")
    for candidate in dict.fromkeys([host, "127.0.0.1"]):
        try:
            with socket.create_connection((candidate, int(port)), timeout=timeout) as conn:
                conn.settimeout(timeout)
                best: tuple[int, int] | None = None
                for _ in range(rounds):
                    sent = time.time_ns()
                    conn.sendall(b"t")
                    reply = b""
                    while len(reply) < 20:
                        piece = conn.recv(20 - len(reply))
                        if not piece:
                            raise ConnectionError("closed")
                        reply += piece
                    received = time.time_ns()
                    remote = int(reply)
                    rtt = received - sent
                    if best is None or rtt < best[0]:
                        best = (rtt, remote - (sent + received) // 2)
                assert best is not None
                return ClockOffset(best[1], best[0] // 2, "tcp", rounds)
        except (OSError, ValueError, ConnectionError):
            continue
    return ClockOffset()


def serve_clock(stop: threading.Event) -> tuple[str, int]:
    """Start the launcher's clock service in a thread; returns (host, port)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(64)
    server.settimeout(0.2)

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5.0)
            with contextlib.suppress(OSError):
                while conn.recv(1):
                    conn.sendall(b"%020d" % time.time_ns())

    def accept() -> None:
        with server:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except (TimeoutError, OSError):
                    continue
                threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, name="traceview-clock", daemon=True).start()
    return socket.gethostname(), server.getsockname()[1]


# --- the collection's configuration and this rank's record ------------------------------------


@dataclass
class Config:
    run_dir: Path
    active: int = 5
    warmup: int = 2
    skip: int = 1
    nvtx: bool = True
    clock: str | None = None
    max_memory: int = DEFAULT_MAX_MEMORY  # 0: no cap
    profile_memory: bool = True  # torch.profiler's profile_memory: the allocator's records
    stall_s: float = DEFAULT_STALL_S  # no progress this long: the step record's stacks

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config | None:
        if not env.get(ENV_RUN_DIR):
            return None
        return cls(
            run_dir=Path(env[ENV_RUN_DIR]),
            active=max(_int(env.get(ENV_STEPS)) or 5, 1),
            warmup=max(_int(env.get(ENV_WARMUP)) or 0, 0) if env.get(ENV_WARMUP) else 2,
            skip=max(_int(env.get(ENV_SKIP)) or 0, 0) if env.get(ENV_SKIP) else 1,
            nvtx=_nvtx_wanted(env),
            clock=env.get(ENV_CLOCK),
            max_memory=max(_int(env.get(ENV_MAX_MEMORY)) or 0, 0)
            if env.get(ENV_MAX_MEMORY)
            else DEFAULT_MAX_MEMORY,
            profile_memory=env.get(ENV_PROFILE_MEMORY, "on") not in ("off", "0"),
            stall_s=_seconds(env.get(ENV_STALL)) or DEFAULT_STALL_S,
        )


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds < 1e7 else None


def _nvtx_wanted(env: Mapping[str, str]) -> bool:
    """NVTX ranges cost a little on every module call: only mark them when a tool listens."""
    setting = env.get(ENV_NVTX, "auto")
    if setting in ("on", "1"):
        return True
    if setting in ("off", "0"):
        return False
    return any(env.get(name) for name in NVTX_TOOL_VARIABLES)


def proc_start_time(pid: int) -> int | None:
    """When process ``pid`` of this host started (field 22 of ``/proc/<pid>/stat``, clock ticks
    since boot; None where there is no such process, or no /proc). A pid and this identify one
    process: a pid recycled later has another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # the command name (field 2, in parentheses) may hold spaces and parentheses itself
            return int(stat.read().rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError, OverflowError):
        return None


def rank_dir(run_dir: Path, rank: int) -> Path:
    return run_dir / "raw" / f"rank-{rank:05d}"


@dataclass
class Status:
    """The rank's own account, written to raw/rank-NNNNN/status.json (read by the launcher)."""

    rank: int
    world_size: int
    local_rank: int
    rank_source: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    python: str = sys.version.split()[0]
    framework: str | None = None
    framework_version: str | None = None
    state: str = "running"  # running | profiling | ok | exception | signal
    detail: str | None = None
    started_ns: int = field(default_factory=time.time_ns)
    ended_ns: int | None = None
    clock: dict[str, Any] = field(default_factory=dict)
    trace_files: list[str] = field(default_factory=list)
    profiled_steps: int = 0
    # the profile window (0: the first; K: the K-th asked of the job, RUN/windows/K) and the
    # job's number of its first recorded step (after its warm-up; null: not said)
    window: int = 0
    first_step: int | None = None
    began_step: int | None = None  # the job's step its profile began in (warm-up included)
    user_profiler: bool = False
    notes: list[str] = field(default_factory=list)
    role: str | None = None  # a parameter-server job's DMLC_ROLE: worker, server, scheduler
    kvstore: str | None = None  # an MXNet job's KVStore type (dist_sync, dist_async...)
    # a profile stopped before its --steps, while the job ran on: why, at which step (the
    # profiler's step number), and whether that step was cut short (then it is left out)
    stop_reason: str | None = None
    stop_step: int | None = None
    stop_mid_step: bool = False
    # [time_ns, resident bytes] of the process at each step boundary while profiling (the
    # framework-independent memory figure; not with --no-memory)
    rss_samples: list[list[int]] = field(default_factory=list)
    # the process's start time (/proc/<pid>/stat, clock ticks since boot): with host and pid,
    # what lets `collect` end a rank left running without ever ending a recycled pid
    proc_start: int | None = field(default_factory=lambda: proc_start_time(os.getpid()))

    def write(self, run_dir: Path) -> None:
        self.write_to(rank_dir(run_dir, self.rank))

    def write_to(self, folder: Path) -> None:
        """Write status.json into ``folder`` (atomically: a temporary name, then renamed)."""
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".status.{os.getpid()}.tmp"
        try:
            tmp.write_text(json.dumps(asdict(self), indent=2))
            os.replace(tmp, folder / "status.json")
        except BaseException:  # (a full disk: no half-written file is left behind)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def sample_resident(status: Status | None, config: Config) -> None:
    """Append the process's resident memory now to the status's step-boundary samples (every
    framework's collector calls it at its step boundaries while it profiles)."""
    if status is None or not config.profile_memory:
        return
    resident = resident_bytes()
    if resident is not None:
        status.rss_samples.append([time.time_ns(), resident])


def resident_bytes() -> int | None:
    """The process's resident set size (Linux /proc/self/statm; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def warn(message: str) -> None:
    with contextlib.suppress(Exception):
        print(f"traceview: {message}", file=sys.stderr, flush=True)


# --- writing the trace, and what stopping costs -------------------------------------------------


#: gzip level of the traces the collector writes: level 3 writes a 212 MB Kineto trace in 0.4 s
#: (9 MB); level 9, torch's, takes 12 s for 3.6 MB while the training thread waits.
TRACE_GZIP_LEVEL = 3


def write_gzip(source: Path, path: Path, level: int = TRACE_GZIP_LEVEL) -> None:
    """Compress ``source`` into ``path`` atomically (a temporary name beside it, then renamed)."""
    import gzip
    import shutil

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(source, "rb") as plain, gzip.open(tmp, "wb", level) as packed:
            shutil.copyfileobj(plain, packed, 1 << 20)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


# --- the memory cap: a profile that grows past it is stopped -------------------------------------


def size_text(size: int) -> str:
    """``4 GiB``, ``1.5 GiB``, ``200 MiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.4g} {unit}"
    return f"{size} B"


#: How often the memory watch looks. Each look takes the GIL for a few µs, but on a busy
#: machine each hand-over of the GIL may cost the training thread milliseconds: at 0.1 s the
#: MXNet live tests' per-step timers saw 10-50 ms of it on 2 overloaded cores (at 0.5 s, rarely).
#: Overshoot: what the profile grows in this time (here up to 100 MiB/s: 50 MiB).
WATCH_INTERVAL_S = 0.5


class MemoryWatch:
    """Watches the process's resident memory while a profile runs: a daemon thread reads
    /proc/self/statm every ``interval`` seconds (about 2 µs a read) and, while the memory has
    grown by more than ``limit`` bytes (0: no limit) since ``start``, calls ``over(first)`` from
    that thread (``first`` the first time), until ``stop``; ``tick()``, if given, every time."""

    def __init__(
        self,
        limit: int,
        over: Callable[[bool], None],
        interval: float = WATCH_INTERVAL_S,
        tick: Callable[[], None] | None = None,
    ):
        self.limit, self.over, self.interval, self.tick = limit, over, interval, tick
        self.stopped = threading.Event()
        self.fd: int | None = None

    def resident(self) -> int:
        assert self.fd is not None
        return int(os.pread(self.fd, 256, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def start(self) -> bool:
        try:
            self.fd = os.open("/proc/self/statm", os.O_RDONLY)
            base = self.resident()
        except (OSError, ValueError, IndexError):
            return False  # no /proc (not Linux): no cap
        threading.Thread(
            target=self._run, args=(base,), name="traceview-memory", daemon=True
        ).start()
        return True

    def _run(self, base: int) -> None:
        first = True
        try:
            while not self.stopped.wait(self.interval):
                if self.tick is not None:
                    self.tick()
                if self.limit > 0 and self.resident() - base > self.limit:
                    self.over(first)
                    first = False
        except Exception as exc:  # never break the job
            warn(f"memory cap off ({type(exc).__name__}: {exc})")
        finally:
            fd, self.fd = self.fd, None
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def stop(self) -> None:
        self.stopped.set()


#: The signal whose Python handler runs a stop on the main thread, asked for by the watch: a
#: *simulated* signal (``_thread.interrupt_main``), so that no system call of the job is
#: interrupted; the handler is only installed where the job leaves the signal at its default.
STOP_SIGNAL: int | None = (
    int(signal.SIGRTMAX) - 2
    if hasattr(signal, "SIGRTMAX") and sys.version_info >= (3, 10)
    else None
)


def arm_main_thread(callback: Callable[[], None]) -> Callable[[], None] | None:
    """On the main thread: returns a function that any thread may call to have ``callback``
    run on the main thread at its next bytecode (None where that cannot be arranged)."""
    signum = STOP_SIGNAL
    if signum is None or threading.current_thread() is not threading.main_thread():
        return None
    import _thread

    def handler(number: int, frame: Any) -> None:
        try:
            callback()
        except Exception as exc:  # runs inside the job's code: must never raise there
            warn(f"could not stop the profile ({type(exc).__name__}: {exc})")

    try:
        if signal.getsignal(signum) not in (signal.SIG_DFL, None):
            return None  # the job uses it
        signal.signal(signum, handler)
    except (ValueError, OSError, TypeError):
        return None

    def poke() -> None:
        with contextlib.suppress(Exception):
            if signal.getsignal(signum) is handler:  # not if the job took the signal since
                # (not signal.Signals(signum): the enum has no member for SIGRTMAX - 2)
                _thread.interrupt_main(signum)  # type: ignore[arg-type]

    poke.handler = handler  # type: ignore[attr-defined]
    return poke


def disarm_main_thread(poke: Callable[[], None] | None) -> None:
    if poke is None or STOP_SIGNAL is None:
        return
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(STOP_SIGNAL) is getattr(poke, "handler", None):
                signal.signal(STOP_SIGNAL, signal.SIG_DFL)


class MemoryCap:
    """The memory cap of one profile. Past it, the collector's ``stop_now()`` is asked for on
    the training thread (torch.profiler can only be stopped on the thread that started it: from
    another one it loses the whole trace): the collector checks ``reached`` at its next step,
    and where the profile started on the main thread, that thread is also interrupted (every
    ``interval`` until it stops), so that a step that never ends is stopped too. ``from_watch``
    (optional) is called once from the watching thread instead, for a framework whose profiler
    may be stopped from any thread; ``tick`` (optional) from that thread every WATCH_INTERVAL_S,
    cap or no cap, until ``close``."""

    def __init__(
        self,
        limit: int,
        stop_now: Callable[[], None],
        from_watch: Callable[[], None] | None = None,
        tick: Callable[[], None] | None = None,
    ):
        self.limit = limit
        self.stop_now, self.from_watch, self.tick = stop_now, from_watch, tick
        self.reached = False
        self.watch: MemoryWatch | None = None
        self.poke: Callable[[], None] | None = None

    @property
    def reason(self) -> str:
        return f"memory cap {size_text(self.limit)} reached"

    def start(self) -> None:
        """Called on the training thread as the profile starts."""
        if self.limit <= 0 and self.tick is None:
            return
        if self.from_watch is None and self.limit > 0:
            self.poke = arm_main_thread(self._on_main_thread)
        self.watch = MemoryWatch(max(self.limit, 0), self._over, tick=self.tick)
        if not self.watch.start():
            self.watch = None

    def _over(self, first: bool) -> None:
        self.reached = True
        if self.from_watch is not None:
            if first:
                self.from_watch()
        elif self.poke is not None:
            self.poke()

    def _on_main_thread(self) -> None:
        if self.reached:
            self.stop_now()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        disarm_main_thread(self.poke)


# --- running code right after a module is imported ----------------------------------------------


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once the top-level module ``name`` has finished importing
    (and ``before()`` right before its body runs: an MXNet server's import never returns)."""

    def __init__(
        self, name: str, callback: Callable[[Any], None], before: Callable[[], None] | None = None
    ):
        self.name = name
        self.callback = callback
        self.before = before
        self.done = False

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != self.name or self.done:
            return None
        self.done = True
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback, before = spec.loader, self.callback, self.before

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                if before is not None:
                    try:
                        before()
                    except Exception as exc:  # never break the job
                        warn(f"could not set up profiling ({type(exc).__name__}: {exc})")
                loader.exec_module(module)
                try:
                    callback(module)
                except Exception as exc:  # never break the job
                    warn(
                        f"could not set up profiling ({type(exc).__name__}: {exc}); running unprofiled"
                    )

        spec.loader = _Loader()
        return spec


# --- exits: normal, exception, SIGTERM -----------------------------------------------------------


class Finishing(Protocol):
    def finish(self, state: str | None = None, detail: str | None = None) -> None: ...


def install_exit_handlers(collector: Finishing) -> None:
    """Write what was recorded when the process exits: normally, by an exception, by SIGTERM.

    A SIGTERM that arrives while the main thread is writing the trace (a rank whose collective
    failed, writing what it has, when its launcher terminates it: torchrun does so at once) waits
    for that write: the handler runs inside it, and ending the process there lost the trace."""
    original = collector.finish
    writing = [0]  # finishes in progress on the main thread
    deferred = [False]  # a SIGTERM that arrived during one

    def record(state: str, detail: str | None, frame: Any = None, tb: Any = None) -> None:
        """The step record's stacks (not for a clean exit) and how the process ends."""
        made = getattr(collector, "_step_record", None)
        if made is None:
            return
        with contextlib.suppress(Exception):
            if state != "ok":
                made.dump(state, frame=frame, tb=tb)
            made.end(state, detail)

    def terminate() -> None:
        made = getattr(collector, "_step_record", None)
        if made is not None:
            made.end("signal", "terminated (SIGTERM)")
        original("signal", "terminated (SIGTERM)")  # keeps the state of a finish before it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def finish(state: str | None = None, detail: str | None = None) -> None:
        main = threading.current_thread() is threading.main_thread()
        writing[0] += main
        try:
            original(state, detail)
        finally:
            writing[0] -= main
        if main and writing[0] == 0 and deferred[0]:
            deferred[0] = False
            terminate()

    with contextlib.suppress(AttributeError, TypeError):
        collector.finish = finish  # type: ignore[method-assign]  # its own calls too

    def at_exit() -> None:
        record("ok", None)
        finish("ok")

    atexit.register(at_exit)
    previous_hook = sys.excepthook

    def excepthook(kind: Any, value: Any, tb: Any) -> None:
        record("exception", f"{kind.__name__}: {value}", tb=tb)
        finish("exception", f"{kind.__name__}: {value}")
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                # A job killed by its launcher (another rank failed) still writes its trace.
                def on_term(signum: int, frame: Any) -> None:
                    made = getattr(collector, "_step_record", None)
                    if made is not None:  # (where the main thread is as the launcher ends it)
                        made.dump("signal", frame=frame)
                    if writing[0]:  # this handler interrupted the write: let it end first
                        deferred[0] = True
                        return
                    terminate()

                signal.signal(signal.SIGTERM, on_term)


# --- entry points ------------------------------------------------------------------------------


class Collector(Protocol):
    """What the entry points ask of a registered collector (``rankside_lifecycle.Collector``,
    which imports this module: this one names it by its shape, not by import)."""

    @property
    def framework(self) -> str: ...

    def phase(self, name: str) -> AbstractContextManager[None]: ...

    def manual_step(self) -> None: ...


#: The collectors of this process, registered by their ``install``; PyTorch's first (the user
#: API's ``phase`` is its when the job runs it).
_collectors: list[Collector] = []


def register(collector: Collector) -> None:
    if collector.framework == "pytorch":
        _collectors.insert(0, collector)
    else:
        _collectors.append(collector)


def current() -> Collector | None:
    return next(iter(_collectors), None)


#: The frameworks profiled, by the top-level module the job imports: each by a sibling module
#: of this one (``rankside_<module>``, standard library only too) that has
#: ``start(config, module)``, called once the job has imported the framework.
FRAMEWORKS: tuple[str, ...] = ("torch", "tensorflow", "mxnet", "chainer", "jax")


def _framework(name: str, config: Config) -> Callable[[Any], None] | None:
    module_name = f"{__package__}.rankside_{name}"
    if importlib.util.find_spec(module_name) is None:  # not written for this framework
        return None
    # A collector may act at start-up, before the job imports anything (MXNet's parameter
    # servers never return from ``import mxnet``): its module's optional ``prepare(config)``.
    try:
        prepare = getattr(importlib.import_module(module_name), "prepare", None)
        if prepare is not None:
            prepare(config)
    except Exception as exc:  # never break the job
        warn(f"could not set up profiling ({type(exc).__name__}: {exc}); running unprofiled")

    def on_import(module: Any) -> None:
        importlib.import_module(module_name).start(config, module)

    return on_import


#: RUN/raw/.started/<host>-<pid>: a Python process of the job started; it holds
#: ``{"host", "pid", "proc_start"}``
STARTED = ".started"


def mark_started(run_dir: Path) -> None:
    """Leave a mark that a Python process of the job started (so that ``collect`` can tell a
    launcher that failed before starting anything from a job that never imported a framework,
    and can end the process if it is still running when the launcher has ended)."""
    with contextlib.suppress(OSError):
        folder = run_dir / "raw" / STARTED
        folder.mkdir(parents=True, exist_ok=True)
        host, pid = socket.gethostname(), os.getpid()
        mark = {"host": host, "pid": pid, "proc_start": proc_start_time(pid)}
        (folder / f"{host}-{pid}").write_text(json.dumps(mark))


def install() -> None:
    """Called by the generated sitecustomize in every Python process of the job."""
    config = Config.from_env(os.environ)
    if config is None:
        return
    mark_started(config.run_dir)
    hooks: dict[str, Callable[[Any], None]] = {}
    for framework in FRAMEWORKS:
        on_import = _framework(framework, config)
        if on_import is not None:
            hooks[framework] = on_import
    for name, callback in hooks.items():
        if name in sys.modules:
            try:
                callback(sys.modules[name])
            except Exception as exc:  # never break the job
                warn(
                    f"could not set up profiling ({type(exc).__name__}: {exc}); running unprofiled"
                )
        else:
            sys.meta_path.insert(0, AfterImport(name, callback))


def phase(name: str) -> AbstractContextManager[None]:
    """A region of the step, for the user API: the framework's profiler region (under
    PyTorch an NVTX range too)."""
    collector = current()
    return collector.phase(name) if collector is not None else contextlib.nullcontext()


def step() -> None:
    """The end of a training step, for the user API (replaces the framework's step hooks)."""
    for collector in list(_collectors):
        collector.manual_step()
