"""Shared fixtures: where the real traces are, and helpers to run the CLI as a user would; the
tiers (each test's folder is its marker); the installed traceview over the source folder."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl
import pytest

if TYPE_CHECKING:
    from traceview.parsers import Parser
    from traceview.runs import Run

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
SAMPLES = REPO / "sample_traces"
SHARED = Path(os.environ.get("TRACEVIEW_SHARED_TRACES", REPO.parent / "shared" / "traces"))


# --- which traceview the tests import ----------------------------------------------------------


def _in_repo_root(entry: str) -> bool:
    try:
        return Path(entry or ".").resolve() == REPO
    except OSError:
        return False


def _installed_traceview_first() -> None:
    """Run from the repository root (the README's ``python -m pytest``), the root is on sys.path
    first (pytest puts it there again before each test module), and ``import traceview`` finds
    the source folder ``traceview/``, whose ``traceview.parsers`` and ``traceview.collectors``
    are the top-level ``parsers/`` and ``collectors/`` (pyproject's package-dir): only an editable
    install maps them. With a non-editable install (``pip install .``), import the installed
    package now, so that every later ``import traceview`` (and its subpackages, found from it)
    is what was installed, while ``tests`` is still the repository's; and let the CLI's child
    processes (``python -m traceview`` from this folder) find it too (PYTHONSAFEPATH: no current
    folder on their sys.path). An editable install, or none, is left as it is."""
    others = [p for p in sys.path if not _in_repo_root(p)]
    if len(others) == len(sys.path) or "traceview" in sys.modules:
        return
    if importlib.machinery.PathFinder.find_spec("traceview", others) is None:
        return
    saved = sys.path[:]
    sys.path[:] = others
    try:
        importlib.import_module("traceview")
    finally:
        sys.path[:] = saved
    if _in_repo_root(os.getcwd()):
        os.environ["PYTHONSAFEPATH"] = "1"


_installed_traceview_first()


def needs_module(module: str, reason: str) -> pytest.MarkDecorator:
    """A mark that skips, with ``reason``, where the optional ``module`` is not installed."""
    try:
        missing = importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        missing = True
    return pytest.mark.skipif(missing, reason=f"{module} is not installed: {reason}")


#: Reading TensorFlow profiles (.xplane.pb) takes xprof, an optional extra.
needs_xprof = needs_module("xprof", "reading .xplane.pb needs it (pip install '.[tensorflow]')")


def reads_xplane(*paths: object) -> bool:
    """Whether any of ``paths`` is a TensorFlow profile (.xplane.pb) or a folder holding one
    (anything else, a golden case's ``report`` or ``--json`` say, is not)."""
    for arg in paths:
        path = Path(str(arg))
        if path.name.endswith(".xplane.pb") or (path.is_dir() and any(path.rglob("*.xplane.pb"))):
            return True
    return False


def in_shared(*paths: object) -> bool:
    """Whether any of ``paths`` is one of the shared traces (../shared/traces)."""
    return any(Path(str(arg)).resolve().is_relative_to(SHARED.resolve()) for arg in paths)


def for_unit(
    values: Iterable[T], paths: Callable[[T], Iterable[object]] = lambda v: (v,)
) -> list[T]:
    """The parameters a unit test takes: those whose ``paths`` read no shared trace and no
    TensorFlow profile (xprof, an optional framework library); the rest are ``beyond_unit``."""
    return [v for v in values if not in_shared(*paths(v)) and not reads_xplane(*paths(v))]


def beyond_unit(
    values: Iterable[T], paths: Callable[[T], Iterable[object]] = lambda v: (v,)
) -> list[Any]:
    """The parameters ``for_unit`` leaves out, those that read a TensorFlow profile marked to skip,
    saying why, where xprof is not installed."""
    return [
        pytest.param(v, marks=needs_xprof) if reads_xplane(*paths(v)) else v
        for v in values
        if in_shared(*paths(v)) or reads_xplane(*paths(v))
    ]


def shared_traces(subdir: str = "") -> Path:
    """The real traces from other people's runs (../shared/traces); skip when absent."""
    path = SHARED / subdir
    if not path.exists():
        pytest.skip(
            f"shared traces not found at {path} (they live beside the repository, not in it)"
        )
    return path


def shared_pytorch_files() -> list[Path]:
    root = SHARED / "pytorch"
    return sorted(root.rglob("*.json.gz")) if root.exists() else []


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


def run_cli(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Result:
    """Run ``python -m traceview`` in a subprocess, exactly as a user's shell would."""
    proc = subprocess.run(
        [sys.executable, "-m", "traceview", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
        timeout=600,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


# What a launcher prints when a process of its job died of a signal or lost a peer before the
# job ended: gloo or gRPC aborting in a rank of a real job on a loaded two-core machine, about
# once in a full run, most often in the job's teardown (a rank's `terminate called`).
JOB_DEATH = re.compile(
    r"Signal \d+ \(SIG(?:ABRT|SEGV|BUS|KILL)\) received by PID"  # torchrun, of a child
    r"|exited on signal (?:6|7|9|11)\b"  # mpirun: SIGABRT, SIGBUS, SIGKILL, SIGSEGV
    r"|terminate called"
    r"|Connection (?:reset|closed) by peer"
)
# A Python exception a process of the job raised of its own (the workload's, or that of
# traceview's collector in it): a failure, never a death, even where its peers then lost it.
_RAISED = re.compile(
    r"^(?:\[[^\]\n]*\]:?[ \t]*)?((?:\w+\.)*\w*(?:Error|Exception|Interrupt))(?::|$)", re.M
)
# ... but not torchrun's own report of its children, nor one that says only that a peer went
_NOT_RAISED = re.compile(
    r"ChildFailedError|by peer|Connection reset|Broken pipe|timed out|Timeout", re.I
)
# The lines of such a death worth keeping in a warning: what the process said as it died.
_DEATH_LINES = re.compile(r"terminate called|what\(\)|SIG[A-Z]{3,}|signal \d+|by peer|Error")


def job_death(result: Result) -> str | None:
    """Where a failed job's stderr says one of its processes died (JOB_DEATH) and none raised
    an exception of its own: the lines that say how, else None (a success, or a failure of
    any other kind)."""
    err = result.err
    if result.code == 0 or not JOB_DEATH.search(err):
        return None
    for raised in _RAISED.finditer(err):
        line = err[raised.start() : err.find("\n", raised.start()) % (len(err) + 1)]
        if not _NOT_RAISED.search(line):
            return None
    lines = [line.strip() for line in err.splitlines() if _DEATH_LINES.search(line)]
    return " | ".join(dict.fromkeys(lines))[:1500] or "no line says how"


def run_job(run: Callable[[], Result], *fresh: Path) -> Result:
    """``run()`` for a command that runs a real multi-process job; when a process of the job
    died (job_death), the paths ``fresh`` are removed and the job is run once more, with the
    first death kept as a warning. A death that repeats, and every other failure, is returned
    as it is: the test then fails on it."""
    result = run()
    why = job_death(result)
    if why is None:
        return result
    warnings.warn(f"a process of the job died ({why}); running the job once more", stacklevel=2)
    for path in fresh:
        shutil.rmtree(path, ignore_errors=True)
    return run()


def run_process(
    argv: list[Any], *, env: dict[str, str] | None = None, timeout: int = 600
) -> Result:
    """``argv`` run to its end with its output captured, as a Result."""
    done = subprocess.run(
        list(map(str, argv)), capture_output=True, text=True, env=env, timeout=timeout
    )
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def cli():
    return run_cli


def analysed(run: Path) -> Run:
    """A run directory's per-rank analysis tables (``.steps``, ``.ops``...) as every command
    reads them (``open_run``: the cached tables where current, recomputed where not)."""
    from traceview.runs import open_run

    with open_run([run]) as opened:
        return opened


def parser_of(path: Path) -> Parser | None:
    """The parser ``ingest`` picks for the trace file ``path`` (``ingest.discover``); None
    where no parser reads it."""
    from traceview.ingest.discover import discover
    from traceview.model.errors import BadInput, Notes
    from traceview.parsers import parser_named

    try:
        (trace,) = discover([path], Notes())
    except BadInput:
        return None
    return parser_named(trace.parser)


def steps_with_timers(run: Path, truth_dir: Path) -> pl.DataFrame:
    """A run's steps table (times in ms, as ``<phase>_tv``) joined to the profiled records of
    the ground truth beside its traces, on rank and step; every step must have its timer."""
    from traceview.model import schema as S

    truth = json.loads((truth_dir / "groundtruth.json").read_text())
    timers = pl.DataFrame([r for r in truth["records"] if r["profiled"]])
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    steps = steps.with_columns(
        (pl.col(c) / 1e6).alias(c.removesuffix("_ns") + "_tv")
        for c in steps.columns
        if c.endswith("_ns")
    )
    joined = steps.join(timers, on=[S.RANK, S.STEP], how="inner")
    assert joined.height == timers.height == steps.height, (
        f"every profiled step has a window and a timer: {steps.height} windows, "
        f"{timers.height} timed steps, {joined.height} matched"
    )
    return joined


# --- the TUI tests' sample runs (ingested once per session, shared read-only) ------------------


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tui-runs")


@pytest.fixture(scope="session")
def ddp(runs_root: Path) -> Iterator[Any]:
    from tests.tui_helpers import sample_run
    from traceview.runs import open_run

    with open_run([sample_run("ddp", runs_root)]) as run:
        yield run


@pytest.fixture(scope="session")
def explicit(runs_root: Path) -> Iterator[Any]:
    from tests.tui_helpers import sample_run
    from traceview.runs import open_run

    with open_run([sample_run("explicit", runs_root)]) as run:
        yield run


# --- the tiers: a test's folder is its marker ---------------------------------------------------

TIERS = ("unit", "integration", "live", "fuzz")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the folder it is in (tests/unit, tests/integration,
    tests/live, tests/fuzz), before ``-m`` selects (the default ``-m 'not fuzz'`` included)."""
    for item in items:
        try:
            rel = item.path.resolve().relative_to(TESTS)
        except ValueError:
            continue
        if len(rel.parts) < 2 or rel.parts[0] not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: a test belongs in one of the tiers' folders "
                f"(tests/{{{','.join(TIERS)}}}/)"
            )
        item.add_marker(rel.parts[0])


# --- the hostile-input corpus's cases (tests/hostile_run.py), for the fast and the full tier ----


@pytest.fixture(scope="session")
def hostile_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """This session's selected cases, run two at a time from the first test on (one pool for
    tests/integration/test_hostile.py and tests/fuzz/test_hostile.py alike)."""
    from tests import hostile_corpus as H
    from tests.hostile_run import Pool

    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "callspec", None) is not None
        and isinstance(item.callspec.params.get("case"), H.Case)
        and not item.get_closest_marker("skip")
    ]
    pool = Pool(selected, tmp_path_factory.mktemp("hostile"))
    yield pool
    for future in pool.futures.values():
        future.cancel()
    pool.executor.shutdown(wait=True)
