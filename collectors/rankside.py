"""What `traceview collect` runs inside every process of the job (standard library only).

`traceview collect` copies this file into the run directory as ``_traceview_rankside.py`` next
to a ``sitecustomize.py`` that imports it, and puts that folder first on the job's PYTHONPATH,
so every Python process of the job loads it at start-up without the training script being
edited, and without traceview having to be importable in the job's environment.

At start-up nothing happens but the installation of an import hook. When the process imports
PyTorch, the hook registers a global optimizer-step hook; the first optimizer step starts
``torch.profiler`` with the collection's schedule, every later one advances it, and the trace
is written to ``RUN/raw/rank-NNNNN/`` when the schedule ends or the process exits. Processes
that never step an optimizer (a launcher's agent, data-loader workers) leave nothing behind.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
        )


def _nvtx_wanted(env: Mapping[str, str]) -> bool:
    """NVTX ranges cost a little on every module call: only mark them when a tool listens."""
    setting = env.get(ENV_NVTX, "auto")
    if setting in ("on", "1"):
        return True
    if setting in ("off", "0"):
        return False
    return any(env.get(name) for name in NVTX_TOOL_VARIABLES)


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
    user_profiler: bool = False
    notes: list[str] = field(default_factory=list)
    role: str | None = None  # a parameter-server job's DMLC_ROLE: worker, server, scheduler
    # a profile stopped before its --steps, while the job ran on: why, at which step (the
    # profiler's step number), and whether that step was cut short (then it is left out)
    stop_reason: str | None = None
    stop_step: int | None = None
    stop_mid_step: bool = False
    # [time_ns, resident bytes] of the process at each step boundary while profiling (the
    # framework-independent memory figure; not with --no-memory)
    rss_samples: list[list[int]] = field(default_factory=list)

    def write(self, run_dir: Path) -> None:
        folder = rank_dir(run_dir, self.rank)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".status.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, folder / "status.json")


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


def write_gzip(source: Path, path: Path) -> None:
    """Compress ``source`` into ``path`` atomically (a temporary name beside it, then renamed)."""
    import gzip
    import shutil

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(source, "rb") as plain, gzip.open(tmp, "wb", TRACE_GZIP_LEVEL) as packed:
            shutil.copyfileobj(plain, packed, 1 << 20)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _trace_only(torch: Any) -> dict[str, Any]:
    """torch.profiler's ``trace_only`` where this torch has it: stopping then builds no Python
    event objects (which only ``events()``/``key_averages()`` need, never the trace). Stopping a
    profile of 550,000 events: +1.35 GiB and 2.9 s instead of +1.64 GiB and 3.7 s (torch 2.13)."""
    config_type = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if config_type is None:
        return {}
    try:
        return {"experimental_config": config_type(trace_only=True)}
    except TypeError:  # an older torch
        return {}


def give_back_memory() -> None:
    """Hand the memory freed by a stopped profile back to the system. Stopping takes several
    times what the profile recorded (1.35 GiB for 150 MiB recorded, freed once the profile
    object goes); glibc keeps freed memory, so without this the job carried it to its end."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).malloc_trim(0)


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


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once the top-level module ``name`` has finished importing."""

    def __init__(self, name: str, callback: Callable[[Any], None]):
        self.name = name
        self.callback = callback
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
        loader, callback = spec.loader, self.callback

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                try:
                    callback(module)
                except Exception as exc:  # never break the job
                    warn(
                        f"could not set up profiling ({type(exc).__name__}: {exc}); running unprofiled"
                    )

        spec.loader = _Loader()
        return spec


# --- PyTorch ----------------------------------------------------------------------------------


class TorchCollector:
    """Drives torch.profiler from a global optimizer-step hook (or from ``step()``)."""

    def __init__(self, config: Config, torch: Any):
        self.config = config
        self.torch = torch
        self.profiler: Any = None
        self.status: Status | None = None
        self.hook: Any = None
        self.stepping_optimizer: int | None = None  # id() of the optimizer that paces steps
        self.steps_seen = 0  # steps ended so far (the profiler is created after --skip of them)
        self.manual = False  # the script calls traceview's step() itself
        self.finished = False
        self.lock = threading.RLock()
        self.nvtx: Any = None
        self.user_profilers = 0  # torch.profiler sessions the script itself has running
        self.cap = MemoryCap(config.max_memory, self._stop_for_memory)
        self.busy = 0  # inside step() or finish() on some thread (a stop must wait for them)
        self.extra_step = 0  # a step the profiler has not counted: it ended at the stop
        self.thread: int | None = None  # the thread that started the profiler

    # the schedule ------------------------------------------------------------------------

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.hook = register_optimizer_step_post_hook(self._after_optimizer_step)
        self._watch_user_profilers()
        if self.config.nvtx:
            self.nvtx = NvtxPhases.install(self.torch)
        install_exit_handlers(self)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.manual or self.finished:
            return
        if self.stepping_optimizer is None:
            self.stepping_optimizer = id(optimizer)
        if id(optimizer) == self.stepping_optimizer:  # several optimizers: the first paces
            self.step()

    def step(self) -> None:
        """End of a training step: count the skipped ones, then start and advance the profiler.

        Nothing of torch.profiler exists during the skipped steps, so they run as fast as
        without traceview.
        """
        with self.lock:
            if self.finished:
                return
            self.steps_seen += 1
            if self.steps_seen <= self.config.skip:
                return
            self.busy += 1
            try:
                if self.profiler is None:
                    self._start()
                    self._sample_memory()
                elif self.profiler is not False:
                    if self.cap.reached:  # past the memory cap: the step that ended is kept
                        self._stop_early(mid_step=False)
                        return
                    self._sample_memory()
                    self.profiler.step()
                    if self.profiler.step_num >= self.config.warmup + self.config.active:
                        self.finish()
            except Exception as exc:
                warn(f"profiling stopped ({type(exc).__name__}: {exc}); the job runs on")
                self._abandon(f"{type(exc).__name__}: {exc}")
            finally:
                self.busy -= 1

    def _sample_memory(self) -> None:
        """The process's resident memory at this step boundary, while the profile runs."""
        if self.profiler:
            sample_resident(self.status, self.config)

    def _stop_for_memory(self) -> None:
        """On the main thread, interrupted past the memory cap: stop inside the step (it is cut
        short, and left out); not while traceview's own step or finish runs on it."""
        with self.lock:
            if not self.busy:
                self._stop_early(mid_step=True)

    def _stop_early(self, mid_step: bool) -> None:
        """Stop the profile before its --steps (the memory cap): write what it has, say why in
        the status, and leave the job to run on unprofiled."""
        if self.finished or not self.profiler or self.status is None:
            return
        step = int(self.profiler.step_num)  # the step in progress (mid_step) or that just ended
        self.status.stop_reason, self.status.stop_step = self.cap.reason, step
        self.status.stop_mid_step = mid_step
        self.extra_step = 0 if mid_step else 1
        warn(f"profile stopped at step {step}: {self.cap.reason}; the job runs on unprofiled")
        self.finish()

    def _start(self) -> None:
        torch = self.torch
        info = self._rank_info()
        self.status = Status(info.rank, info.world_size, info.local_rank, info.source)
        self.status.framework, self.status.framework_version = "pytorch", str(torch.__version__)
        self.status.clock = asdict(probe_clock(self.config.clock))
        if self.user_profilers or _profiler_enabled(torch):
            # The script profiles on its own: keep its traces (see _watch_user_profilers).
            self.status.user_profiler = True
            self.status.notes.append("the script runs torch.profiler itself; its trace is kept")
            self.profiler = False
            self.status.write(self.config.run_dir)
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = torch.profiler.schedule(
            wait=0, warmup=self.config.warmup, active=self.config.active, repeat=1
        )
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self._export,
            record_shapes=True,
            profile_memory=self.config.profile_memory,
            **_trace_only(torch),
        )
        self.status.state = "profiling"
        self.status.write(self.config.run_dir)
        self.thread = threading.get_ident()
        self.cap.start()  # its thread starts before the profile, not inside a step of it
        self.profiler.start()
        if threading.current_thread() is not threading.main_thread():
            _thread_end.sentinel = _StopAtThreadEnd(self)

    def _rank_info(self) -> RankInfo:
        info = detect_rank(os.environ)
        with contextlib.suppress(Exception):
            dist = self.torch.distributed
            if dist.is_available() and dist.is_initialized():
                return RankInfo(
                    dist.get_rank(), dist.get_world_size(), info.local_rank, "torch.distributed"
                )
        return info

    def _export(self, profiler: Any) -> None:
        assert self.status is not None
        folder = rank_dir(self.config.run_dir, self.status.rank)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank-{self.status.rank}.pt.trace.json.gz"
        plain = folder / f".{path.name}.{os.getpid()}.tmp.json"
        try:
            # Written plain, then compressed here: given a .gz path, torch compresses at level 9
            # line by line (12 s for a 212 MB trace, with the training thread waiting; 0.4 s here)
            profiler.export_chrome_trace(str(plain))
            write_gzip(plain, path)
        finally:
            with contextlib.suppress(OSError):
                plain.unlink()
        self.status.trace_files = [path.name]
        self.status.profiled_steps = max(
            profiler.step_num + self.extra_step - self.config.warmup, 0
        )

    def finish(self, state: str | None = None, detail: str | None = None) -> None:
        """Stop profiling (writing what was recorded) and leave the job alone from now on.

        ``state`` records how the process ends (ok, exception, signal) when called at exit;
        None when only the profiling window is over.
        """
        with self.lock:
            if not self.finished:
                # The hooks stay registered (removing one from inside a hook would change the
                # dict torch is iterating over); they return at once from now on.
                self.finished = True
                self.cap.close()
                if state is not None:
                    self._past_cap("exit")
                if self.profiler and threading.get_ident() != self.thread:
                    # torch.profiler stopped on another thread than the one that started it
                    # loses the trace, or (that thread gone, at exit) crashes the process
                    why = "torch.profiler can only be stopped on the thread that started it"
                    warn(f"trace not written: {why}")
                    if self.status is not None:
                        self.status.notes.append(f"trace not written: {why}")
                elif self.profiler:
                    try:
                        self.profiler.stop()
                    except Exception as exc:
                        warn(f"could not write the trace ({type(exc).__name__}: {exc})")
                        if self.status is not None:
                            self.status.notes.append(f"trace not written: {exc}")
                    self.profiler = False
                    give_back_memory()  # what stopping took, the job no longer carries
            if self.status is None:
                return  # never stepped: nothing to report (an agent, a data-loader worker)
            if state is not None and self.status.ended_ns is None:
                self.status.state = state
                self.status.detail = detail
                self.status.ended_ns = time.time_ns()
            elif self.status.state == "profiling":
                self.status.state = "running"  # the window is over; the process goes on
            with contextlib.suppress(Exception):
                self.status.write(self.config.run_dir)

    def _past_cap(self, when: str) -> None:
        """Past the cap, but never stopped on the training thread until ``when``: say so."""
        status = self.status
        if self.cap.reached and self.profiler and status and status.stop_reason is None:
            status.stop_reason = f"{self.cap.reason}, stopped only at {when}"
            status.stop_step = int(self.profiler.step_num)
            status.stop_mid_step = True

    def _abandon(self, reason: str) -> None:
        self.finished = True
        self.cap.close()
        if self.status is not None:
            self.status.notes.append(f"profiling stopped: {reason}")
            with contextlib.suppress(Exception):
                self.status.write(self.config.run_dir)

    # scripts that profile on their own ------------------------------------------------------

    def _watch_user_profilers(self) -> None:
        """A script's own torch.profiler wins: ours steps aside, theirs is copied into the run."""
        profile_cls = self.torch.profiler.profile
        collector = self
        original_start = profile_cls.start
        original_export = profile_cls.export_chrome_trace

        original_stop = profile_cls.stop

        def start(profiler: Any) -> None:
            if profiler is not collector.profiler:
                collector.user_profilers += 1
                if collector.profiler:
                    collector._yield_to_user_profiler()
            original_start(profiler)

        def stop(profiler: Any) -> None:
            if profiler is not collector.profiler:
                collector.user_profilers = max(collector.user_profilers - 1, 0)
            original_stop(profiler)

        def export_chrome_trace(profiler: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            result = original_export(profiler, path, *args, **kwargs)
            if profiler is not collector.profiler:
                collector._keep_user_trace(Path(path))
            return result

        profile_cls.start = start
        profile_cls.stop = stop
        profile_cls.export_chrome_trace = export_chrome_trace

    def _yield_to_user_profiler(self) -> None:
        with self.lock:
            self.cap.close()
            profiler, self.profiler = self.profiler, False
            with contextlib.suppress(Exception):
                profiler.on_trace_ready = None
                profiler.stop()
            if self.status is not None:
                self.status.user_profiler = True
                self.status.notes.append(
                    "the script started torch.profiler itself; its trace is kept"
                )

    def _keep_user_trace(self, path: Path) -> None:
        with contextlib.suppress(Exception):
            if self.status is None:
                info = self._rank_info()
                self.status = Status(info.rank, info.world_size, info.local_rank, info.source)
                self.status.framework, self.status.framework_version = (
                    "pytorch",
                    str(self.torch.__version__),
                )
                self.status.clock = asdict(probe_clock(self.config.clock))
                self.profiler = False
            self.status.user_profiler = True
            folder = rank_dir(self.config.run_dir, self.status.rank)
            folder.mkdir(parents=True, exist_ok=True)
            suffix = ".json.gz" if path.name.endswith(".gz") else ".json"
            target = folder / f"rank-{self.status.rank}.pt.trace{suffix}"
            for old in folder.glob("rank-*.pt.trace.json*"):
                old.unlink()  # one trace per rank: the script's latest export
            tmp = folder / f".{target.name}.{os.getpid()}.tmp"
            tmp.write_bytes(path.read_bytes())
            os.replace(tmp, target)
            self.status.trace_files = [target.name]
            self.status.write(self.config.run_dir)


#: Per thread: what a training thread that is not the main one does as it ends.
_thread_end = threading.local()


class _StopAtThreadEnd:
    """Kept in the training thread's thread-local storage, which Python clears on that thread
    as it ends: a profile still open then is stopped there, the only thread torch.profiler can
    be stopped on (left open, the process crashed at exit: SIGSEGV)."""

    def __init__(self, collector: TorchCollector):
        self.collector = collector

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            collector = self.collector
            if threading.get_ident() == collector.thread:
                with collector.lock:
                    collector._past_cap("the end of its thread")
                    collector.finish()


def _profiler_enabled(torch: Any) -> bool:
    with contextlib.suppress(Exception):
        return bool(torch.autograd.profiler._is_profiler_enabled)
    return False


class NvtxPhases:
    """NVTX ranges for the phases (data, forward, backward, optimizer), for Nsight Systems."""

    def __init__(self, nvtx: Any):
        self.nvtx = nvtx

    @classmethod
    def install(cls, torch: Any) -> NvtxPhases | None:
        try:
            import nvtx  # the NVIDIA nvtx package; absent: no ranges
        except ImportError:
            return None
        depth = threading.local()
        broken: list[bool] = []

        def push(name: str) -> None:
            if broken:
                return
            try:
                nvtx.push_range(name, domain="traceview")
            except Exception as exc:  # an NVTX problem must not reach the training loop
                broken.append(True)
                warn(f"NVTX ranges off ({type(exc).__name__}: {exc})")

        def pop() -> None:
            if broken:
                return
            try:
                nvtx.pop_range(domain="traceview")
            except Exception:
                broken.append(True)

        # forward: the outermost module call
        def forward_pre(module: Any, args: Any) -> None:
            level = getattr(depth, "forward", 0)
            depth.forward = level + 1
            if level == 0:
                push("forward")

        def forward_post(module: Any, args: Any, output: Any) -> None:
            depth.forward = getattr(depth, "forward", 1) - 1
            if depth.forward == 0:
                pop()

        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        nn_module.register_module_forward_pre_hook(forward_pre)
        nn_module.register_module_forward_hook(forward_post)
        optim_module.register_optimizer_step_pre_hook(lambda *a: push("optimizer"))
        optim_module.register_optimizer_step_post_hook(lambda *a: pop())

        # backward and data loading: wrap the calls
        def wrap(owner: Any, attr: str, name: str) -> None:
            original = getattr(owner, attr)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                push(name)
                try:
                    return original(*args, **kwargs)
                finally:
                    pop()

            setattr(owner, attr, wrapped)

        wrap(torch.autograd, "backward", "backward")
        from torch.utils.data import dataloader

        wrap(dataloader._BaseDataLoaderIter, "__next__", "data")
        return cls(nvtx)


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

    def terminate() -> None:
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
    atexit.register(finish, "ok")
    previous_hook = sys.excepthook

    def excepthook(kind: Any, value: Any, tb: Any) -> None:
        finish("exception", f"{kind.__name__}: {value}")
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                # A job killed by its launcher (another rank failed) still writes its trace.
                def on_term(signum: int, frame: Any) -> None:
                    if writing[0]:  # this handler interrupted the write: let it end first
                        deferred[0] = True
                        return
                    terminate()

                signal.signal(signal.SIGTERM, on_term)


# --- entry points ------------------------------------------------------------------------------

_collector: TorchCollector | None = None
#: Collectors of the sibling frameworks, registered by their ``start``; each has
#: ``manual_step()`` (the user API's step) and ``phase(name)`` (a context manager).
_sibling_collectors: list[Any] = []


def register(collector: Any) -> None:
    _sibling_collectors.append(collector)


def current() -> Any:
    return _collector if _collector is not None else next(iter(_sibling_collectors), None)


#: Frameworks profiled by a sibling module (``<this module>_<framework>``, also standard library
#: only), loaded when the job imports the framework; each has ``start(core, config, framework)``.
SIBLING_FRAMEWORKS: tuple[str, ...] = ("tensorflow", "mxnet", "chainer")


def _sibling(framework: str, config: Config) -> Callable[[Any], None] | None:
    name = f"{__name__}_{framework}"
    if importlib.util.find_spec(name) is None:  # not written yet for this framework
        return None
    # A sibling may act at start-up, before the job imports anything (MXNet's parameter
    # servers never return from ``import mxnet``): its optional ``prepare(core, config)``.
    try:
        prepare = getattr(importlib.import_module(name), "prepare", None)
        if prepare is not None:
            prepare(sys.modules[__name__], config)
    except Exception as exc:  # never break the job
        warn(f"could not set up profiling ({type(exc).__name__}: {exc}); running unprofiled")

    def on_import(module: Any) -> None:
        importlib.import_module(name).start(sys.modules[__name__], config, module)

    return on_import


STARTED = ".started"  # RUN/raw/.started/<host>-<pid>: a Python process of the job started


def mark_started(run_dir: Path) -> None:
    """Leave a mark that a Python process of the job started (so that ``collect`` can tell a
    launcher that failed before starting anything from a job that never imported a framework)."""
    with contextlib.suppress(OSError):
        folder = run_dir / "raw" / STARTED
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{socket.gethostname()}-{os.getpid()}").touch()


def install() -> None:
    """Called by the generated sitecustomize in every Python process of the job."""
    config = Config.from_env(os.environ)
    if config is None:
        return
    mark_started(config.run_dir)

    def on_torch(torch: Any) -> None:
        global _collector
        _collector = TorchCollector(config, torch)
        _collector.install()

    hooks: dict[str, Callable[[Any], None]] = {"torch": on_torch}
    for framework in SIBLING_FRAMEWORKS:
        sibling = _sibling(framework, config)
        if sibling is not None:
            hooks[framework] = sibling
    for name, callback in hooks.items():
        if name in sys.modules:
            try:
                callback(sys.modules[name])
            except Exception as exc:  # never break the job
                warn(
                    f"could not set up profiling ({type(exc).__name__}: {exc}); running unprofiled"
                )
        else:
            sys.meta_path.insert(0, _AfterImport(name, callback))


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """A region of the step, for the user API: a profiler region and an NVTX range."""
    collector = _collector
    if collector is None:
        sibling = next(iter(_sibling_collectors), None)
        with sibling.phase(name) if sibling is not None else contextlib.nullcontext():
            yield
        return
    region = collector.torch.profiler.record_function(f"## {name} ##")
    nvtx = collector.nvtx
    if nvtx is not None:
        nvtx.nvtx.push_range(name, domain="traceview")
    with region:
        try:
            yield
        finally:
            if nvtx is not None:
                nvtx.nvtx.pop_range(domain="traceview")


def step() -> None:
    """The end of a training step, for the user API (replaces the optimizer hook)."""
    collector = _collector
    if collector is not None:
        collector.manual = True
        collector.step()
    for sibling in _sibling_collectors:
        sibling.manual_step()
