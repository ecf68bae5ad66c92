"""Jobs that die badly under ``traceview collect`` (issue 36): the cases, defined once, that
tests/fuzz/test_collect_faults.py runs in full (``python -m pytest -m fuzz
tests/fuzz/test_collect_faults.py``) and tests/live/test_collect_faults.py samples (one per
class) in the default command.

Five classes, each with its variants:

1. **launchers that die** and leave ranks running (``LAUNCHER_ENDS``): a launcher that starts
   its ranks in sessions of their own and is SIGKILLed, dies of SIGTERM, or exits 0 while they
   run; ranks that ignore SIGTERM; ``mpirun`` SIGKILLed;
2. **hostile status.json** a rank wrote (``STATUSES``): not an object, lists for mappings, a
   string world size, numbers too large, nesting 100,000 deep, invalid UTF-8, 17 MB, a FIFO, a
   pid that is not the job's;
3. **a run directory that cannot be written** (``UNWRITABLE``): a read-only file system, a full
   one, /proc;
4. **a file system that fills** while the rank writes (``FULL``): before its status, between
   status and trace, after the trace (ingest);
5. **interrupted** (``INTERRUPTS``): Ctrl-C or SIGTERM before any rank imported PyTorch, or
   before it profiled.

Every case runs collect as a user's shell would (its own process; its output to files, not
pipes: a process of the job left running would hold a pipe open) and checks: the exit code
(0, 2 or the job's); no "internal error" or "Traceback" and at most one error line, the last;
no process of the job alive once collect has returned (by pid: the ranks' own account, the
marks every process of the job leaves, what the launcher printed), nothing written into the
run directory after it returned, and nothing outside it touched. Classes 3 and 4 mount small
tmpfs file systems (root only; skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO

WORKLOADS = REPO / "tests" / "workloads"
LAUNCHER = WORKLOADS / "orphaning_launcher.py"
PY = sys.executable
QUICK = ("--steps", "2", "--warmup", "0")  # (a short profile: the cases are about the ends)


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    run: Path
    seconds: float
    pids: set[int] = field(default_factory=set)  # the job's processes, as far as known


def _snapshot(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` (links not followed) but those under ``skip``: size, mtime."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in [*dirnames, *filenames]:
            path = here / name
            if path in skip:
                continue
            with contextlib.suppress(OSError):
                st = path.lstat()
                found[str(path)] = (st.st_size, st.st_mtime_ns)
    return found


def _job_pids(outcome_out: str, run: Path) -> set[int]:
    """The job's processes on this host: what the launcher printed, the ranks' status files and
    the mark each Python process of the job leaves."""
    pids = {
        int(p) for line in re.findall(r"rank pids: ([\d ]+)", outcome_out) for p in line.split()
    }
    raw = run / "raw"
    marks = [*raw.glob("*/status.json"), *(raw / ".started").glob("*")] if raw.is_dir() else []
    for path in marks:
        with contextlib.suppress(OSError, ValueError, RecursionError):
            if not path.is_file() or path.stat().st_size > 1 << 20:
                continue
            mark = json.loads(path.read_bytes())
            here = isinstance(mark, dict) and mark.get("host") == socket.gethostname()
            if here and type(mark.get("pid")) is int:
                pids.add(mark["pid"])
        if path.parent.name == ".started":  # <host>-<pid>
            host, _, pid = path.name.rpartition("-")
            if host == socket.gethostname() and pid.isdigit():
                pids.add(int(pid))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_collect(
    tmp_path: Path,
    job: list[str | Path],
    *,
    run: Path | None = None,
    options: tuple[str, ...] = (),
    during: Callable[[subprocess.Popen[bytes], Path], None] | None = None,
    timeout: float = 90,
    job_files: tuple[Path, ...] = (),
    innocent: frozenset[int] = frozenset(),
) -> Outcome:
    """``traceview collect -o RUN OPTIONS -- JOB`` in its own process, then every check that
    holds for all cases. ``during(proc, run)`` acts on it while it runs (kills a launcher,
    sends Ctrl-C); ``job_files`` are files the job itself writes outside the run directory;
    ``innocent``: pids a hostile status names that are not the job's (not checked, never
    killed)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    run = run or work / "run"
    watched = tmp_path
    before = _snapshot(watched, (run, *job_files, tmp_path / "out.txt", tmp_path / "err.txt"))
    argv = [PY, "-m", "traceview", "collect", "-o", str(run), *options, "--", *map(str, job)]
    env = {**os.environ, "COLUMNS": "120"}
    started = time.monotonic()
    with (tmp_path / "out.txt").open("wb") as out, (tmp_path / "err.txt").open("wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=work, env=env)
        try:
            if during is not None:
                during(proc, run)
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seconds = time.monotonic() - started
    outcome = Outcome(
        proc.returncode,
        (tmp_path / "out.txt").read_text(errors="replace"),
        (tmp_path / "err.txt").read_text(errors="replace"),
        run,
        seconds,
    )
    outcome.pids = _job_pids(outcome.out, run) - set(innocent) - {os.getpid()}
    written = _snapshot(run) if run.is_dir() else {}
    time.sleep(0.5)
    try:
        alive = sorted(p for p in outcome.pids if _alive(p))
        assert not alive, f"processes of the job alive after collect returned: {alive}"
        if run.is_dir():
            assert _snapshot(run) == written, "written into the run directory after collect"
        after = _snapshot(watched, (run, *job_files, tmp_path / "out.txt", tmp_path / "err.txt"))
        changed = sorted(set(before) ^ set(after)) + sorted(
            p for p in set(before) & set(after) if before[p] != after[p] and p != str(work)
        )
        assert not changed, f"touched outside the run directory: {changed}"
        check_stderr(outcome)
    finally:
        for pid in outcome.pids:  # (a failing case must not leave its job running)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return outcome


def check_stderr(outcome: Outcome) -> None:
    err = outcome.err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("traceview: error")]
    assert len(errors) <= 1, err
    ours = [i for i, line in enumerate(lines) if line.startswith("traceview:")]
    if errors:
        assert errors[0] == ours[-1], f"the error line is not the last of collect's: {err}"


# --- 1. launchers that die, ranks left running ------------------------------------------------


def _mpirun() -> list[str]:
    found = shutil.which("mpirun", path=str(Path(PY).parent)) or shutil.which("mpirun")
    if found is None:
        pytest.skip("mpirun not found (pip install -e '.[mpi]' provides Open MPI)")
    return [found, "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def _kill_mpirun(proc: subprocess.Popen[bytes], run: Path) -> None:
    """Once both ranks run PyTorch, SIGKILL their parent (mpirun, prterun)."""
    statuses = [run / "raw" / f"rank-{r:05d}" / "status.json" for r in (0, 1)]
    deadline = time.monotonic() + 60
    pids: list[int] = []
    while len(pids) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "the ranks never started"
        time.sleep(0.2)
        with contextlib.suppress(OSError, ValueError):
            pids = [json.loads(s.read_text())["pid"] for s in statuses]
    stat = Path(f"/proc/{pids[0]}/stat").read_bytes()
    parent = int(stat.rpartition(b")")[2].split()[1])
    os.kill(parent, signal.SIGKILL)


LAUNCHER_ENDS = {
    # name: (launcher arguments or "mpirun", expected exit code)
    "launcher SIGKILLed": (["--end", "kill"], 137),
    "launcher dies of SIGTERM": (["--end", "term"], 143),
    "launcher exits 0, ranks run on": (["--end", "exit"], 0),
    "ranks ignore SIGTERM": (["--end", "kill", "--ignore-term"], 137),
    "PyTorch ranks, launcher SIGKILLed": (["--end", "kill", "--torch"], 137),
    "PyTorch ranks ignore SIGTERM": (["--end", "exit", "--torch", "--ignore-term"], 0),
    "mpirun SIGKILLed": ("mpirun", 137),
}


def launcher_ends(tmp_path: Path, name: str) -> None:
    how, code = LAUNCHER_ENDS[name]
    if how == "mpirun":
        job = [*_mpirun(), PY, WORKLOADS / "ddp_train.py", "--no-ddp", "--steps", "1000000"]
        outcome = run_collect(tmp_path, job, options=QUICK, during=_kill_mpirun)
    else:
        outcome = run_collect(tmp_path, [PY, LAUNCHER, *how], options=QUICK)
    assert outcome.code == code, outcome.err
    assert len(outcome.pids) >= 2, (outcome.out, outcome.err)
    assert re.search(r"process\(es\) of the job still ran after the launcher ended", outcome.err)
    assert outcome.seconds < 60


# --- 2. hostile status.json -------------------------------------------------------------------


def _huge_file(innocent: int) -> bytes:
    return b'{"rank": 1, "notes": ["' + b"x" * (17 << 20) + b'"]}'


def _not_the_job_s(innocent: int) -> bytes:
    """A status naming a live process of this host that is not the job's, its start time right:
    collect must not end it."""
    start = int(Path(f"/proc/{innocent}/stat").read_bytes().rpartition(b")")[2].split()[19])
    mark = {"rank": 1, "host": socket.gethostname(), "pid": innocent, "proc_start": start}
    return json.dumps(mark).encode()


#: name: the status.json's bytes (given the pid of a process that is not the job's), or None
#: for a FIFO in its place
STATUSES: dict[str, Callable[[int], bytes] | None] = {
    "not an object": lambda _: b"[1, 2, 3]",
    "a string": lambda _: b'"rank 1"',
    "lists where mappings belong": lambda _: b'{"rank": 1, "clock": [1, 2], "notes": {"a": 1}}',
    "a string world size": lambda _: b'{"rank": 1, "world_size": "2", "pid": "12"}',
    "numbers too large": lambda _: (
        b'{"rank": 1, "world_size": 1'
        + b"0" * 40
        + b', "pid": 1e999, "started_ns": 1'
        + b"0" * 5000
        + b"}"
    ),
    "nested 100,000 deep": lambda _: (
        b'{"rank": 1, "clock": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    ),
    "invalid UTF-8": lambda _: b'{"rank": 1, "host": "\xff\xfe", "state": "ok\xc0"}',
    "17 MB": _huge_file,
    "another rank's number": lambda _: b'{"rank": 7, "world_size": 2, "state": "ok"}',
    "a pid not the job's": _not_the_job_s,
    "a FIFO": None,
}

HOSTILE_JOB = """
import os, runpy, sys
from pathlib import Path
folder = Path(os.environ["TRACEVIEW_RUN_DIR"]) / "raw" / "rank-00001"
folder.mkdir(parents=True, exist_ok=True)
source = Path(sys.argv[1])
if source.name == "fifo":
    os.mkfifo(folder / "status.json")
else:
    (folder / "status.json").write_bytes(source.read_bytes())
sys.argv = [sys.argv[2], "--steps", "6"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def hostile_status(tmp_path: Path, name: str) -> None:
    """A real PyTorch rank 0, and beside it a status.json of rank 1 that the job wrote."""
    make = STATUSES[name]
    innocent = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    try:
        source = tmp_path / ("fifo" if make is None else "status.json")
        source.write_bytes(b"" if make is None else make(innocent.pid))
        job = [PY, "-c", HOSTILE_JOB, source, WORKLOADS / "ddp_train.py"]
        outcome = run_collect(
            tmp_path,
            job,
            options=QUICK,
            innocent=frozenset({innocent.pid}),
        )
        assert innocent.poll() is None, "collect ended a process that was not the job's"
    finally:
        innocent.kill()
        innocent.wait()
    assert outcome.code == 0, outcome.err
    assert "Per rank" in outcome.out, outcome.err  # rank 0 is reported
    warned = [line for line in outcome.err.splitlines() if "rank-00001/status.json" in line]
    assert len(warned) <= 1, outcome.err
    report = subprocess.run(
        [PY, "-m", "traceview", "report", str(outcome.run)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert "Traceback" not in report.stderr and "internal error" not in report.stderr


# --- 3. a run directory that cannot be written -------------------------------------------------


@contextlib.contextmanager
def tmpfs(where: Path, size: str, *, readonly: bool = False) -> Iterator[Path]:
    """A small tmpfs mounted at ``where`` (root only: skipped where mount is not permitted)."""
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if readonly else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(folder: Path) -> Path:
    ballast = folder / "ballast"
    with contextlib.suppress(OSError), ballast.open("wb") as file:
        while True:
            file.write(b"\0" * 65536)
            file.flush()
    return ballast


UNWRITABLE = ("read-only file system", "read-only, inside", "full file system", "/proc")


def unwritable(tmp_path: Path, name: str) -> None:
    """The job must never start: one line, exit 2, nothing left where -o pointed."""
    marker = tmp_path / "job-ran"
    job = [PY, "-c", f"open({str(marker)!r}, 'w').close()"]
    with contextlib.ExitStack() as stack:
        if name == "/proc":
            run = Path("/proc/traceview-run")
        elif name == "full file system":
            fs = stack.enter_context(tmpfs(tmp_path / "fs", "1m"))
            _fill(fs)
            run = fs / "run"
        else:
            fs = stack.enter_context(tmpfs(tmp_path / "fs", "1m", readonly=True))
            run = fs if name == "read-only file system" else fs / "run"
        outcome = run_collect(tmp_path, job, run=run, job_files=(tmp_path / "fs",))
        assert outcome.code == 2, outcome.err
        lines = outcome.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("traceview: error: "), outcome.err
        assert not marker.exists(), "the job was started"
        if name == "full file system":
            assert sorted(p.name for p in fs.iterdir()) == ["ballast"], "the run was left behind"


# --- 4. a file system that fills while the rank writes -----------------------------------------

FULL = {
    # name: (fill before or after training, bytes left free again)
    "full before the rank writes": ("before", 0),
    "room for the status, not the trace": ("before", 12_000),
    "full after the trace (the ingest)": ("after", 16_384),
}


def full_disk(tmp_path: Path, name: str) -> None:
    """The job's exit code (3) passes through, a warning (not an error) says what happened, and
    no message names a file outside the run directory."""
    when, leave = FULL[name]
    with tmpfs(tmp_path / "fs", "4m") as fs:
        run, ballast = fs / "run", fs / "ballast"
        job = [PY, WORKLOADS / "full_disk.py", ballast, "--when", when, "--leave", str(leave),
               "--exit", "3"]  # fmt: skip
        outcome = run_collect(tmp_path, job, run=run, options=QUICK, job_files=(fs,))
        assert outcome.code == 3, outcome.err
        assert "traceview: error" not in outcome.err
        ours = [line for line in outcome.err.splitlines() if line.startswith("traceview:")]
        assert any("full" in line or "No space left" in line for line in ours), outcome.err
        for line in ours:
            for path in re.findall(re.escape(str(tmp_path)) + r"[^\s:;,()]*", line):
                assert path.startswith(str(run)), f"names a file outside the run: {line}"
        assert run.is_dir(), "what the ranks wrote is kept"


# --- 5. interrupted before any rank profiled ---------------------------------------------------

SLEEPER = (
    "import signal, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "time.sleep(60)\n"
    "import torch\n"
)

RUN_TRAIN = (
    "import runpy, sys\n"
    f"sys.argv = [{str(WORKLOADS / 'ddp_train.py')!r}, '--steps', '1000000']\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)

INTERRUPTS = {
    # name: (signal, the job, what to wait for under RUN/raw, expected code)
    "Ctrl-C before PyTorch": (signal.SIGINT, [PY, "-c", SLEEPER], ".started", 130),
    "SIGTERM before PyTorch": (signal.SIGTERM, [PY, "-c", SLEEPER], ".started", 143),
    "Ctrl-C while PyTorch loads": (
        signal.SIGINT,
        [PY, "-c", SLEEPER.replace("time.sleep(60)\n", "") + RUN_TRAIN],
        ".started",
        130,
    ),
}


def interrupted(tmp_path: Path, name: str) -> None:
    signum, job, wait_for, code = INTERRUPTS[name]

    def interrupt(proc: subprocess.Popen[bytes], run: Path) -> None:
        deadline = time.monotonic() + 60
        while not any((run / "raw").glob(wait_for)):
            assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
            time.sleep(0.1)
        time.sleep(0.2)
        proc.send_signal(signum)

    outcome = run_collect(tmp_path, job, options=("--skip", "100000"), during=interrupt)
    assert outcome.code == code, outcome.err
    assert f"interrupted ({signal.Signals(signum).name})" in outcome.err, outcome.err
    assert "imported PyTorch" not in outcome.err, outcome.err


#: A launcher that has not started any process of the job when it is interrupted, and exits 1 on
#: a signal (as mpirun does): collect's code is the signal's, not the launcher's.
EARLY_LAUNCHER = ["sh", "-c", 'trap "exit 1" INT TERM HUP; sleep 30 & wait']
EARLY_INTERRUPTS = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}


def interrupted_before_the_job(tmp_path: Path, name: str) -> None:
    signum = signal.Signals[name]

    def interrupt(proc: subprocess.Popen[bytes], run: Path) -> None:
        deadline = time.monotonic() + 60
        while not (run / "raw").is_dir():  # (collect has made the run directory)
            assert time.monotonic() < deadline and proc.poll() is None, "collect never started"
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signum)

    outcome = run_collect(tmp_path, EARLY_LAUNCHER, during=interrupt)
    assert outcome.code == EARLY_INTERRUPTS[name], outcome.err
    line = next(x for x in outcome.err.splitlines() if x.startswith("traceview: interrupted"))
    assert line.startswith(f"traceview: interrupted ({name}) before any rank"), outcome.err
    assert "removed the empty run directory" in line and "exited with code 1" in line
    assert not (tmp_path / "work" / "run").exists()
