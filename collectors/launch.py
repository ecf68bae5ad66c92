"""`traceview collect`: run a job with every rank profiled, then read what it left behind.

The job's command is run unchanged, except that its environment carries a folder (first on
PYTHONPATH) holding a ``sitecustomize.py`` that loads the rank-side collectors (the package
``_traceview_rankside``: a copy of every ``rankside*.py``) into every Python process, plus the
collection's settings. MPI launchers get
the variables passed on to remote ranks (``-x`` for Open MPI, ``-genv`` for MPICH and Intel
MPI); Slurm's srun, torchrun and plain processes inherit them.

While the job runs, this process serves its clock on a TCP port so each rank can measure its
clock's offset to it. Signals (Ctrl-C, SIGTERM, SIGHUP) are passed to the job, which runs in a
session of its own; whatever the ranks wrote is kept. When the launcher ends, every process of
the job still running on this host is ended (``end_job``), so none writes into the run
directory while it is read. Then the run directory is ingested and the report printed, and the
job's exit code returned.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceview import __version__
from traceview.model.manifest import MAX_PID, MAX_WORLD_SIZE, RankStatus
from traceview.store import rundir as R

from . import RANKSIDE_MODULE, rankside

BOOTSTRAP_DIR = ".traceview-bootstrap"
OPEN_MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun", "oshrun")
HYDRA_LAUNCHERS = ("mpiexec.hydra", "mpirun.hydra")

SITECUSTOMIZE = f'''"""Written by `traceview collect`: loads traceview's collector into every Python process of
the job, then the sitecustomize this file shadows, if there is one."""

import sys as _sys

try:
    import {RANKSIDE_MODULE}

    {RANKSIDE_MODULE}.install()
except Exception as _exc:  # the job must run on, profiled or not
    print(f"traceview: collector not loaded ({{type(_exc).__name__}}: {{_exc}})", file=_sys.stderr)


def _chain():
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in _sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_chain()
del _chain
'''


RANKSIDE_INIT = '''"""Written by `traceview collect`: traceview's rank-side modules, copies of
traceview.collectors' rankside*.py. The runtime's entry points are here, where sitecustomize and
the user API (traceview.collectors.step/phase) call them."""

from .rankside import current, install, phase, step

__all__ = ["current", "install", "phase", "step"]
'''


@dataclass
class CollectSettings:
    steps: int = 5
    warmup: int = 2
    skip: int = 1
    nvtx: str = "auto"  # on | off | auto (on when an NVTX tool such as Nsight Systems is attached)
    # bytes a rank's memory may grow by while it profiles; 0: no cap
    max_memory: int = rankside.DEFAULT_MAX_MEMORY
    profile_memory: bool = True  # the framework's memory records (--memory / --no-memory)
    stall_s: float = rankside.DEFAULT_STALL_S  # a rank this long without progress: its stacks


@dataclass
class JobResult:
    command: list[str]
    launched: list[str]
    exit_code: int
    started: float
    ended: float
    interrupted: str | None = None
    statuses: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)  # the launcher's last stderr lines
    # processes of the job still running when the launcher ended, which collect ended (pids),
    # and those it could not end
    ended_processes: list[int] = field(default_factory=list)
    left_running: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the job wrote that did not read


class _StderrTail(threading.Thread):
    """Passes the job's stderr through to ours as it comes, keeping its last lines (to say
    why a launch failed)."""

    def __init__(self, stream: Any, keep: int = 40, out: Any = None) -> None:
        super().__init__(daemon=True)
        self.stream, self.keep, self.out = stream, keep, out
        self.lines: list[str] = []

    def run(self) -> None:
        out = self.out or getattr(sys.stderr, "buffer", None)
        for raw in iter(self.stream.readline, b""):
            if out is not None:
                out.write(raw)
                out.flush()
            line = raw.decode("utf-8", "replace").strip()
            if line:
                self.lines = [*self.lines[-(self.keep - 1) :], line]
        self.stream.close()

    def summary(self) -> list[str]:
        """The lines that say what happened: the last one with words in it, or where the output
        ends with a message Open MPI frames in dashes, that message (its first line says what it
        is). Other frames (torchrun's lines of "=") are not lines that say anything. The
        collector's own lines ("traceview: ...") are left out: they are on the screen already,
        and quoting one again under collect's verdict only repeats it."""
        lines = [line for line in self.lines if not line.startswith("traceview:")]
        rule = [i for i, line in enumerate(lines) if set(line) == {"-"}]
        if rule and rule[-1] == len(lines) - 1:
            start = rule[-2] + 1 if len(rule) > 1 else 0
            return lines[start:-1]
        return [line for line in lines if any(c.isalnum() for c in line)][-1:]


def default_run_dir() -> Path:
    base = Path(f"traceview-run-{time.strftime('%Y%m%d-%H%M%S')}")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def write_bootstrap(run: Path) -> Path:
    """The job's bootstrap folder: ``sitecustomize.py`` and the package ``_traceview_rankside``,
    which holds the rank-side modules (every ``rankside*.py``: the runtime, the lifecycle, one
    per framework) under their own names, and the runtime's entry points in its ``__init__``.
    The modules import each other relatively only, so they run there as they do as
    ``traceview.collectors`` (where the tests and the type checker see them), and the job needs
    no traceview installed."""
    folder = run / BOOTSTRAP_DIR
    package = folder / RANKSIDE_MODULE
    package.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (package / "__init__.py").write_text(RANKSIDE_INIT)
    for source in Path(rankside.__file__).parent.glob("rankside*.py"):
        shutil.copyfile(source, package / source.name)
    return folder


def mpi_flavor(executable: str) -> str | None:
    """ "openmpi", "hydra" (MPICH, Intel MPI, MVAPICH) or None, from ``--version``."""
    try:
        proc = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = proc.stdout + proc.stderr
    if "Open MPI" in text or "Open RTE" in text or "OpenRTE" in text or "prterun" in text:
        return "openmpi"
    if any(word in text for word in ("HYDRA", "MPICH", "Intel(R) MPI", "MVAPICH")):
        return "hydra"
    return None


def pass_environment(command: list[str], env: dict[str, str], names: list[str]) -> list[str]:
    """The command with the launcher flags that carry ``names`` to remote ranks."""
    launcher = Path(command[0]).name
    if launcher in HYDRA_LAUNCHERS:
        flavor: str | None = "hydra"
    elif launcher in OPEN_MPI_LAUNCHERS:
        flavor = mpi_flavor(command[0])
    else:
        return list(command)
    if flavor == "openmpi":
        extra = [arg for name in names for arg in ("-x", name)]
    elif flavor == "hydra":
        extra = [arg for name in names for arg in ("-genv", name, env[name])]
    else:
        return list(command)
    return [command[0], *extra, *command[1:]]


def job_environment(
    run: Path, bootstrap: Path, settings: CollectSettings, clock: str
) -> dict[str, str]:
    env = dict(os.environ)
    python_path = [str(bootstrap.resolve())]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(python_path)
    env[rankside.ENV_RUN_DIR] = str(run.resolve())
    env[rankside.ENV_STEPS] = str(settings.steps)
    env[rankside.ENV_WARMUP] = str(settings.warmup)
    env[rankside.ENV_SKIP] = str(settings.skip)
    env[rankside.ENV_CLOCK] = clock
    env[rankside.ENV_NVTX] = settings.nvtx
    env[rankside.ENV_MAX_MEMORY] = str(settings.max_memory)
    env[rankside.ENV_PROFILE_MEMORY] = "on" if settings.profile_memory else "off"
    env[rankside.ENV_STALL] = str(settings.stall_s)
    # PyTorch's Flight Recorder (its last collectives, gloo's too), dumped by the step record
    # when a rank stalls or ends badly; a job's own setting is kept
    env.setdefault(FLIGHT_RECORDER, str(FLIGHT_RECORDER_ENTRIES))
    return env


FLIGHT_RECORDER = "TORCH_FR_BUFFER_SIZE"
FLIGHT_RECORDER_ENTRIES = 2000


PASSED_VARIABLES = (
    "PYTHONPATH",
    rankside.ENV_RUN_DIR,
    rankside.ENV_STEPS,
    rankside.ENV_WARMUP,
    rankside.ENV_SKIP,
    rankside.ENV_CLOCK,
    rankside.ENV_NVTX,
    rankside.ENV_MAX_MEMORY,
    rankside.ENV_PROFILE_MEMORY,
    rankside.ENV_STALL,
    FLIGHT_RECORDER,
)


def prepare_run(run: Path) -> Path:
    """Make the run directory and its bootstrap folder, before the job starts; returns the
    bootstrap folder. Where they cannot be written (a full disk, a read-only one), an
    ``OutputError`` naming ``run``, and nothing of them is left."""
    from traceview.model.errors import cannot_write

    existed = run.exists()
    try:
        (run / R.RAW).mkdir(parents=True, exist_ok=True)
        return write_bootstrap(run)
    except OSError as exc:
        for made in (run / BOOTSTRAP_DIR, run / R.RAW):
            shutil.rmtree(made, ignore_errors=True)
        if not existed:
            with contextlib.suppress(OSError):
                run.rmdir()
        raise cannot_write(run, OSError(exc.errno, exc.strerror)) from None


def run_job(
    command: list[str],
    run: Path,
    settings: CollectSettings,
    bootstrap: Path | None = None,
    output: Path | None = None,
    started_job: Callable[[], None] | None = None,
) -> JobResult:
    """Run ``command`` with every rank profiled into ``run`` (``bootstrap``: what
    ``prepare_run`` made, made here otherwise); returns how it went. ``output``: the job's
    stdout and stderr go to this file instead of ours (collect --live); ``started_job``:
    called once the job runs and RUN/live.json says so."""
    if bootstrap is None:
        bootstrap = prepare_run(run)
    stop_clock = threading.Event()
    host, port = rankside.serve_clock(stop_clock)
    env = job_environment(run, bootstrap, settings, f"{host}:{port}")
    launched = pass_environment(command, env, list(PASSED_VARIABLES))
    started = time.time()
    interrupted: list[str] = []
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: Any) -> None:
        interrupted.append(signal.Signals(signum).name)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    # Our handlers go in before the job starts: a signal caught by a handler is reset to its
    # default in the job, where one ignored (SIG_IGN, as a non-interactive shell's background
    # job has SIGINT) would stay ignored, and a Ctrl-C forwarded to the job would do nothing.
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[sig] = signal.signal(sig, forward)
    # this process's children before the job: not the job's (collect has none; a caller may)
    ours = {p.pid for p in _processes().values() if p.ppid == os.getpid()}
    _subreaper(True)
    log = None
    try:
        if output is not None:
            log = open(output, "ab")  # noqa: SIM115 (closed once the job's output ends)
        child = subprocess.Popen(
            launched, env=env, start_new_session=True, stderr=subprocess.PIPE, stdout=log
        )
    except OSError as exc:
        if log is not None:
            log.close()
        _subreaper(False)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_clock.set()
        raise JobNotStarted(
            f"cannot run {shlex.quote(command[0])}: {exc.strerror or exc}"
        ) from None
    children.append(child)
    launcher_start = rankside.proc_start_time(child.pid)
    live = write_live(run, settings, started, child.pid)
    tail = _StderrTail(child.stderr, out=log)
    tail.start()
    if started_job is not None:
        started_job()
    ended: list[int] = []
    left: list[int] = []
    try:
        code = child.wait()
        # No process of the job outlives it: a rank the launcher left running (killed, or
        # exited before its ranks) would write into the run directory while it is read.
        ended, left = end_job(run, child.pid, launcher_start, ours, read_statuses(run))
    finally:
        _subreaper(False)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_clock.set()
    tail.join(timeout=5)  # the job's own children may still hold the pipe: do not wait on them
    if log is not None and not tail.is_alive():
        log.close()
    if code < 0:
        code = 128 - code  # killed by a signal: report it as a shell would
    write_live(
        run, settings, started, child.pid, {**live, "exit_code": code, "ended_ns": time.time_ns()}
    )
    warnings: list[str] = []
    return JobResult(
        command=list(command),
        launched=launched,
        exit_code=code,
        started=started,
        ended=time.time(),
        interrupted=interrupted[0] if interrupted else None,
        statuses=read_statuses(run, warnings),
        stderr_tail=tail.summary(),
        ended_processes=ended,
        left_running=left,
        warnings=warnings,
    )


class JobNotStarted(Exception):
    pass


#: RUN/live.json: the job collect runs (who runs it, where, since when, with which settings;
#: its exit code once it ended), for ``traceview watch`` and ``traceview profile``
LIVE = R.LIVE


def write_live(
    run: Path,
    settings: CollectSettings,
    started: float,
    launcher_pid: int,
    said: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write RUN/live.json (atomically, never raising): ``said``, or what collect knows as the
    job starts."""
    import socket

    said = said or {
        "collect_pid": os.getpid(),
        "host": socket.gethostname(),
        "launcher_pid": launcher_pid,
        "started_ns": int(started * 1e9),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "stall_s": settings.stall_s,
        "steps": settings.steps,
        "warmup": settings.warmup,
    }
    tmp = run / f".{LIVE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(said))
        os.replace(tmp, run / LIVE)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return said


# --- the job's processes left running once its launcher has ended -------------------------------

#: prctl(2)'s PR_SET_CHILD_SUBREAPER (Linux): an orphaned descendant is re-parented here
PR_SET_CHILD_SUBREAPER = 36
#: how long a process of the job left running gets between SIGTERM (its collector writes what
#: it recorded) and SIGKILL
TERM_GRACE_S = 2.0


def _subreaper(on: bool) -> None:
    """Make this process the subreaper of its descendants (Linux; elsewhere nothing): a process
    of the job whose parent dies (a launcher killed, a rank started in a session of its own) is
    re-parented here, not to init, so it can still be found and ended, and is reaped here."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


@dataclass(frozen=True)
class _Process:
    pid: int
    ppid: int
    pgid: int
    start: int  # /proc/<pid>/stat's start time, clock ticks since boot
    zombie: bool


def _processes() -> dict[int, _Process]:
    """Every process of this host that /proc shows (empty where there is no /proc)."""
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as file:
                    fields = file.read().rpartition(b")")[2].split()
                pid = int(entry.name)
                found[pid] = _Process(
                    pid, int(fields[1]), int(fields[2]), int(fields[19]), fields[0] in (b"Z", b"X")
                )
            except (OSError, ValueError, IndexError):
                continue  # (ended meanwhile)
    return found


def _recorded(run: Path, statuses: list[dict[str, Any]]) -> dict[int, int]:
    """pid -> start time of the job's Python processes on this host, as they recorded them: the
    marks every one leaves at start-up (raw/.started/) and the ranks' status files. One without
    a start time is left out (its pid alone could have been recycled)."""
    here = socket.gethostname()
    marks: list[Any] = list(statuses)
    with contextlib.suppress(OSError):
        for mark in (run / R.RAW / rankside.STARTED).iterdir():
            with contextlib.suppress(OSError, ValueError, RecursionError):
                fd = os.open(mark, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO must not block)
                with os.fdopen(fd, "rb") as file:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        marks.append(json.loads(file.read(4096)))
    recorded = {}
    for mark in marks:
        if not isinstance(mark, dict) or mark.get("host") != here:
            continue
        pid, start = mark.get("pid"), mark.get("proc_start")
        if type(pid) is int and type(start) is int and 1 < pid <= MAX_PID and pid != os.getpid():
            recorded[pid] = start
    return recorded


def _in_run(pid: int, run: Path) -> bool:
    """Whether process ``pid`` runs with ``run`` as its collection's run directory (in its
    environment, as every process of the job has it): what a pid written in the run directory
    (untrusted) must also show before it is ended."""
    wanted = f"{rankside.ENV_RUN_DIR}={run.resolve()}".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            return wanted in file.read().split(b"\0")
    except OSError:
        return False


def _job_processes(
    run: Path,
    launcher: int,
    launcher_start: int | None,
    ours: set[int],
    recorded: dict[int, int],
) -> dict[int, int]:
    """pid -> start time of the job's processes alive now on this host: this process's
    descendants (the launcher's re-parented here, ``ours`` left out: they are not the job's),
    the launcher's process group, and the recorded processes that are still the same process
    and are this run's."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found = set()
    todo = [pid for pid in children.get(os.getpid(), []) if pid not in ours]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    if launcher_start is not None:  # (a group is the launcher's only while it began after it)
        found |= {p.pid for p in procs.values() if p.pgid == launcher and p.start >= launcher_start}
    found |= {
        pid
        for pid, start in recorded.items()
        if pid in procs and procs[pid].start == start and _in_run(pid, run)
    }
    found.discard(os.getpid())
    return {pid: procs[pid].start for pid in found if pid in procs}


def _reap(pids: Any) -> None:
    """Collect the exit of those of ``pids`` that are this process's children (re-parented
    here) and have ended, so that no zombie of the job is left."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _alive(targets: dict[int, int]) -> dict[int, int]:
    """Those of ``targets`` (pid -> start time) not yet gone. A zombie of this process counts
    until it is reaped (its leader thread shows as a zombie while the others still end); one of
    another process that is not among ``targets`` is dead and not ours to reap."""
    procs = _processes()
    alive = {}
    for pid, start in targets.items():
        proc = procs.get(pid)
        if proc is None or proc.start != start:
            continue
        if proc.zombie and proc.ppid != os.getpid() and proc.ppid not in targets:
            continue
        alive[pid] = start
    return alive


def end_job(
    run: Path,
    launcher: int,
    launcher_start: int | None,
    ours: set[int],
    statuses: list[dict[str, Any]],
    grace: float = TERM_GRACE_S,
) -> tuple[list[int], list[int]]:
    """End every process of the job still running on this host once its launcher has ended
    (killed, or gone before its ranks): SIGTERM, so a rank's collector writes what it recorded,
    then SIGKILL after ``grace`` seconds. Returns the pids it ended and those it could not."""
    recorded = _recorded(run, statuses)
    targets: dict[int, int] = {}  # pid -> start time of every process of the job found
    signalled: set[int] = set()
    deadline = time.monotonic() + grace
    while True:
        _reap(targets)
        found = _job_processes(run, launcher, launcher_start, ours, recorded)
        alive = _alive(targets)
        targets = {**alive, **found}  # (one gone and its pid given again is another process)
        alive = _alive(targets)
        if not alive:
            break
        now = time.monotonic()
        if now > deadline + 5.0:  # SIGKILLed 5 s ago, still there: stuck in the kernel
            return sorted(signalled - set(alive)), sorted(alive)
        for pid in alive:
            if now >= deadline or pid not in signalled:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL if now >= deadline else signal.SIGTERM)
                signalled.add(pid)
        time.sleep(0.05)
    _reap(signalled)
    return sorted(signalled), []


def read_statuses(run: Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The status.json of every process the job recorded. What the job wrote is untrusted: each
    file is read as ``RankStatus`` field by field (what does not read is left out), a file that
    does not read at all is skipped, and what was wrong is added to ``warnings`` (as
    ``raw/FOLDER/status.json: ...``)."""
    from traceview.model.manifest import read_status

    statuses = []
    # rank-NNNNN/ for the ranks; other folders for processes that are recorded but not
    # profiled (an MXNet parameter-server job's scheduler-N/, server-N/)
    for path in sorted((run / R.RAW).glob("*/status.json")):
        where = f"{R.RAW}/{path.parent.name}/{path.name}"
        folder = path.parent.name
        try:
            # a process that is not a rank (an MXNet scheduler or server) says rank -1
            record, problem = read_status(path, () if folder.startswith("rank-") else ("rank",))
        except FileNotFoundError:  # (gone since the listing)
            continue
        if problem and warnings is not None:
            warnings.append(f"{where}: {problem}")
        status: dict[str, Any] = record.to_builtins()
        if problem and status == RankStatus().to_builtins():
            continue  # nothing read
        number = folder.removeprefix("rank-")
        if folder.startswith("rank-") and number.isdigit() and status.get("rank") != int(number):
            # a rank writes its status into its own folder (rankside.rank_dir): the folder wins
            if warnings is not None:
                warnings.append(
                    f"{where}: says rank {status.get('rank')}, taken as rank {int(number)}"
                )
            status["rank"] = int(number) if int(number) < MAX_WORLD_SIZE else None
        status["folder"] = folder
        # names inside the rank's folder (never a path that leads out of the run)
        listed = [
            path.parent / name
            for name in status.get("trace_files") or []
            if name and ".." not in Path(name).parts and not Path(name).is_absolute()
        ]
        status["trace_present"] = any(_is_file(f) for f in listed) or any(
            path.parent.glob("rank-*.pt.trace.json*")
        )
        statuses.append(status)
    return statuses


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte
        return False


def _is_rank(status: dict[str, Any]) -> bool:
    return status.get("role") in (None, "", "worker")


def collect_manifest(result: JobResult, settings: CollectSettings) -> dict[str, Any]:
    """The "collect" section of the run's manifest: what ran, where, and how each rank ended."""
    ranks = []
    processes = []
    for status in result.statuses:
        state = status.get("state")
        if status.get("ended_ns") is None and state in ("running", "profiling", "stopping"):
            # The process never reached its exit handlers: killed, crashed, or still running
            # (a "stopping" status keeps the detail of where: inside the profiler's stop).
            state = "crashed" if result.exit_code != 0 else "unknown"
        if not _is_rank(status):
            processes.append(
                {
                    "role": status.get("role"),
                    "trace": status.get("trace_present", False),
                    "host": status.get("host"),
                    "pid": status.get("pid"),
                    "state": state,
                    "detail": status.get("detail"),
                    "framework": status.get("framework"),
                }
            )
            continue
        ranks.append(
            {
                "rank": status.get("rank"),
                "host": status.get("host"),
                "pid": status.get("pid"),
                "state": state,
                "detail": status.get("detail"),
                "trace": status.get("trace_present", False),
                "framework": status.get("framework"),
                "framework_version": status.get("framework_version"),
                "clock": status.get("clock", {}),
                "rank_source": status.get("rank_source"),
                "user_profiler": status.get("user_profiler", False),
                "profiled_steps": status.get("profiled_steps"),
                "stop_reason": status.get("stop_reason"),
                "stop_step": status.get("stop_step"),
                "stop_mid_step": status.get("stop_mid_step", False),
                "notes": status.get("notes", []),
                "kvstore": status.get("kvstore"),
            }
        )
    worlds = [s["world_size"] for s in result.statuses if s.get("world_size") and _is_rank(s)]
    return {
        "command": result.command,
        "launched": result.launched,
        "exit_code": result.exit_code,
        "interrupted": result.interrupted,
        "start": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(result.started)),
        "end": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(result.ended)),
        "seconds": round(result.ended - result.started, 3),
        "schedule": {
            "skip": settings.skip,
            "warmup": settings.warmup,
            "steps": settings.steps,
            "max_memory": settings.max_memory,
        },
        "world_size": max(worlds) if worlds else None,
        "hosts": sorted({r["host"] for r in ranks if r.get("host")}),
        "ranks": sorted(ranks, key=lambda r: r["rank"] if r["rank"] is not None else -1),
        "processes": processes,  # recorded but not profiled (parameter-server roles)
        "traceview_version": __version__,
        "python": sys.version.split()[0],
    }
