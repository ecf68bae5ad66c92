"""`traceview collect`: run a job with every rank profiled, then read what it left behind.

The job's command is run unchanged, except that its environment carries a folder (first on
PYTHONPATH) holding a ``sitecustomize.py`` that loads the rank-side collectors (the package
``_traceview_rankside``: a copy of every ``rankside*.py``) into every Python process, plus the
collection's settings. MPI launchers get
the variables passed on to remote ranks (``-x`` for Open MPI, ``-genv`` for MPICH and Intel
MPI); Slurm's srun, torchrun and plain processes inherit them.

While the job runs, this process serves its clock on a TCP port so each rank can measure its
clock's offset to it. Signals (Ctrl-C, SIGTERM, SIGHUP) are passed to the job, which runs in a
session of its own; whatever the ranks wrote is kept. Then the run directory is ingested and
the report printed, and the job's exit code returned.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceview import __version__
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


class _StderrTail(threading.Thread):
    """Passes the job's stderr through to ours as it comes, keeping its last lines (to say
    why a launch failed)."""

    def __init__(self, stream: Any, keep: int = 40) -> None:
        super().__init__(daemon=True)
        self.stream, self.keep = stream, keep
        self.lines: list[str] = []

    def run(self) -> None:
        out = getattr(sys.stderr, "buffer", None)
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
    return env


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
)


def run_job(command: list[str], run: Path, settings: CollectSettings) -> JobResult:
    """Run ``command`` with every rank profiled into ``run``; returns how it went."""
    (run / R.RAW).mkdir(parents=True, exist_ok=True)
    bootstrap = write_bootstrap(run)
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
    try:
        child = subprocess.Popen(launched, env=env, start_new_session=True, stderr=subprocess.PIPE)
    except OSError as exc:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_clock.set()
        raise JobNotStarted(
            f"cannot run {shlex.quote(command[0])}: {exc.strerror or exc}"
        ) from None
    children.append(child)
    tail = _StderrTail(child.stderr)
    tail.start()
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_clock.set()
    tail.join(timeout=5)  # the job's own children may still hold the pipe: do not wait on them
    if code < 0:
        code = 128 - code  # killed by a signal: report it as a shell would
    return JobResult(
        command=list(command),
        launched=launched,
        exit_code=code,
        started=started,
        ended=time.time(),
        interrupted=interrupted[0] if interrupted else None,
        statuses=read_statuses(run),
        stderr_tail=tail.summary(),
    )


class JobNotStarted(Exception):
    pass


def read_statuses(run: Path) -> list[dict[str, Any]]:
    statuses = []
    # rank-NNNNN/ for the ranks; other folders for processes that are recorded but not
    # profiled (an MXNet parameter-server job's scheduler-N/, server-N/)
    for path in sorted((run / R.RAW).glob("*/status.json")):
        try:
            status = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        status["folder"] = path.parent.name
        listed = [path.parent / name for name in status.get("trace_files") or []]
        status["trace_present"] = any(f.is_file() for f in listed) or any(
            path.parent.glob("rank-*.pt.trace.json*")
        )
        statuses.append(status)
    return statuses


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
            }
        )
    worlds = [int(s["world_size"]) for s in result.statuses if s.get("world_size") and _is_rank(s)]
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
