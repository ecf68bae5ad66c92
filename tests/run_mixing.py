"""Issue 36, a run directory that mixes runs, and concurrent use: the cases, defined once.

Each case makes a run directory hold something that is not its own — a rank's events copied
from another run, a link out of the directory (``events/``, a rank's folder or file, the
manifest, a cached table, the memory table, the export folder), a cached table of another run —
or runs traceview against itself (a report recomputing while an ingest replaces the run; two
ingests into one ``-o``), through the real CLI, and checks what every case must hold:

- exit 0 or 2, never an internal error or a traceback;
- the refused part named (a warning where the rest is analysed, the one line of exit 2);
- nothing outside the run directory changed (another run's files, a link's target);
- no mixed run read as valid: the manifest's run id is every events file's and every cached
  table's (``R.CACHE_KEY``) once traceview is done with it.

tests/integration/test_run_mixing.py runs one or two per class; tests/fuzz/test_run_mixing.py
runs them all, the concurrent ones repeated (``python -m pytest -m fuzz
tests/fuzz/test_run_mixing.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import SAMPLES, Result, run_cli
from traceview.analysis import RANK_TABLES
from traceview.runs import ingest_run
from traceview.store import rundir as R

DDP = SAMPLES / "pytorch" / "ddp"


@dataclass
class Runs:
    """Two runs of the same traces (so their numbers agree and only their ids differ), and
    what a report of the first says."""

    a: Path
    b: Path
    summary: dict


def make_runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("mixing")
    a, b = ingest_run([DDP], root / "a"), ingest_run([DDP], root / "b")
    report = run_cli("report", "--json", a)
    assert report.code == 0, report.err
    return Runs(a, b, report.json()["summary"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return make_runs(tmp_path_factory)


def run_id(run: Path) -> str | None:
    return json.loads((run / R.MANIFEST).read_text())["run_id"]


def events_run_id(path: Path) -> str:
    return str(pq.read_table(path, columns=["run_id"]).column(0)[0].as_py())


def cache_run_id(path: Path) -> str | None:
    key = (pq.read_schema(path).metadata or {}).get(R.CACHE_KEY)
    return json.loads(key)["run_id"] if key else None


def snapshot(*folders: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folders`` (links not followed): its content's hash and mtime."""
    found = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                stat = path.stat()
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[str(path)] = (digest, stat.st_mtime_ns)
    return found


def assert_clean(result: Result) -> None:
    assert result.code in (0, 2), (result.code, result.err)
    assert "internal error" not in result.err and "Traceback" not in result.err, result.err
    if result.code == 2:
        assert len(result.err.strip().splitlines()) == 1, result.err


def assert_one_run(run: Path) -> None:
    """The manifest's run id is every (contained) events file's and every cached table's."""
    expected = run_id(run)
    for rank, path in R._rank_parts(run):
        if R.leads_out(run, path) is None:
            assert events_run_id(path) == expected, f"rank {rank}: another run's events"
    for name in RANK_TABLES:
        path = run / f"{name}.parquet"
        if path.is_file() and R.leads_out(run, path) is None:
            assert cache_run_id(path) in (expected, None), f"{name}: another run's cache"


# --- the static cases: a run directory made to hold another run's parts ----------------------


@dataclass(frozen=True)
class Case:
    """``make`` turns a copy of run a into the case (given run b and a folder outside both);
    the report exits ``code``; ``says`` is in its warnings (exit 0) or its one line (exit 2);
    ``ranks`` are the ranks it reports (exit 0)."""

    id: str
    make: Callable[[Path, Path, Path], None]
    code: int
    says: tuple[str, ...]
    ranks: tuple[int, ...] = (0, 1)
    export: bool = False  # also export the run (the same refusals, nothing written out)


def _foreign(ranks: tuple[int, ...]) -> Callable[[Path, Path, Path], None]:
    def make(run: Path, other: Path, outside: Path) -> None:
        for rank in ranks:
            shutil.copy2(R.events_path(other, rank), R.events_path(run, rank))

    return make


def _link(name: str, to: Callable[[Path, Path], Path]) -> Callable[[Path, Path, Path], None]:
    """``name`` in the run replaced by a symbolic link to ``to(other, outside)``."""

    def make(run: Path, other: Path, outside: Path) -> None:
        path = run / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        os.symlink(to(other, outside), path)

    return make


def _sentinel(name: str) -> Callable[[Path, Path], Path]:
    """A copy of the other run's ``name`` outside both runs: a link's target to watch."""

    def target(other: Path, outside: Path) -> Path:
        copy = outside / f"sentinel-{name.replace('/', '_')}"
        shutil.copy2(other / name, copy)
        return copy

    return target


def _cache_of_other(name: str) -> Callable[[Path, Path, Path], None]:
    def make(run: Path, other: Path, outside: Path) -> None:
        shutil.copy2(other / f"{name}.parquet", run / f"{name}.parquet")

    return make


def _unlisted(rank: int, source: int) -> Callable[[Path, Path, Path], None]:
    """The run's own events of rank ``source`` copied in as a rank its manifest does not list
    (its run id is right: only the manifest tells it is not the run's)."""

    def make(run: Path, other: Path, outside: Path) -> None:
        target = R.events_path(run, rank)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(R.events_path(run, source), target)

    return make


def _export_out(run: Path, other: Path, outside: Path) -> None:
    (outside / "exported").mkdir()
    os.symlink(outside / "exported", run / "export")


def _half(name: str) -> Callable[[Path, Path, Path], None]:
    """The run's file ``name`` cut to its first half (a copy cut short: unreadable)."""

    def make(run: Path, other: Path, outside: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: len(data) // 2])

    return make


OUT = "a symbolic link out of the run directory"

CASES = [
    Case("foreign-rank0", _foreign((0,)), 0, ("rank 0 left out: its events belong to run",), (1,)),
    Case(
        "foreign-rank1",
        _foreign((1,)),
        0,
        ("rank 1 left out: its events belong to run",),
        (0,),
        export=True,
    ),
    Case("foreign-all", _foreign((0, 1)), 2, ("no rank left", "its events belong to run")),
    Case(
        "unlisted-rank",
        _unlisted(5, 1),
        0,
        ("rank(s) 5 left out", "manifest does not list"),
        (0, 1),
        export=True,
    ),
    Case("events-dir-link", _link("events", lambda o, _: o / "events"), 2, ("events/rank=", OUT)),
    Case(
        "rank-folder-link",
        _link("events/rank=1", lambda o, _: o / "events" / "rank=1"),
        0,
        ("rank 1 left out", "events/rank=1", OUT),
        (0,),
        export=True,
    ),
    Case(
        "rank-file-link",
        _link("events/rank=1/part-0.parquet", _sentinel("events/rank=1/part-0.parquet")),
        0,
        ("rank 1 left out", "part-0.parquet", OUT),
        (0,),
    ),
    Case("manifest-link", _link(R.MANIFEST, _sentinel(R.MANIFEST)), 2, ("manifest.json", OUT)),
    *(
        Case(
            f"cache-link-{name}",
            _link(f"{name}.parquet", _sentinel(f"{name}.parquet")),
            0,
            (),
            export=True,
        )
        for name in ("steps", "comm")
    ),
    Case(
        "memory-link",
        _link("memory.parquet", _sentinel("memory.parquet")),
        0,
        ("memory records left out", OUT),
    ),
    Case(  # (one file of every rank's memory records: left out, not every rank)
        "memory-cut-short",
        _half("memory.parquet"),
        0,
        ("memory records left out", "memory.parquet", "unreadable"),
        (0, 1),
    ),
    *(Case(f"cache-of-other-{n}", _cache_of_other(n), 0, ()) for n in ("steps", "ops", "gpu")),
    Case("export-folder-link", _export_out, 0, (), export=True),
]


def check_case(case: Case, runs: Runs, tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(runs.a, run, symlinks=True)
    outside.mkdir()
    case.make(run, runs.b, outside)
    before = snapshot(runs.b, outside)
    result = run_cli("report", "--json", run)
    assert_clean(result)
    assert result.code == case.code, result.err
    if result.code == 0:
        report = result.json()
        assert [r["rank"] for r in report["ranks"]] == list(case.ranks)
        said = [w for w in report["warnings"] if all(s in w for s in case.says)]
        assert said or not case.says, report["warnings"]
        if case.ranks == (0, 1):  # nothing refused: the run's own numbers
            assert report["summary"] == runs.summary
    else:
        assert all(s in result.err for s in case.says), result.err
    if case.export:
        exported = run_cli("export", run)
        assert_clean(exported)
        if case.id == "export-folder-link":
            assert exported.code == 2 and OUT in exported.err, exported.err
        else:
            assert exported.code == 0, exported.err
            if case.ranks != (0, 1) or case.id == "unlisted-rank":
                assert "left out" in exported.err, exported.err
    assert snapshot(runs.b, outside) == before, "a file outside the run directory changed"
    if case.code == 0 and case.id.startswith("cache-"):
        for name in RANK_TABLES:  # the cache was written again, in the run directory
            assert not (run / f"{name}.parquet").is_symlink()
    if (run / R.MANIFEST).is_file() and R.leads_out(run, run / R.MANIFEST) is None:
        if not case.id.startswith("foreign"):  # (those events are the case's own doing)
            assert_one_run(run)
        for name in RANK_TABLES:  # whatever the case left, no cache of another run is read
            path = run / f"{name}.parquet"
            if path.is_file() and R.leads_out(run, path) is None:
                assert cache_run_id(path) in (run_id(run), None)


# --- the concurrent cases: real processes against one run directory --------------------------


def _start(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "traceview", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )


def _finish(proc: subprocess.Popen[str]) -> Result:
    out, err = proc.communicate(timeout=300)
    return Result(proc.returncode, out, err)


#: How long after the ingest starts each round's report starts, in seconds: an ingest of the
#: samples takes about a second, a report's recompute about as long.
LAGS = (0.6, 0.2, 1.0, 0.4, 0.8, 0.0)


def check_report_during_ingest(runs: Runs, tmp_path: Path, rounds: int) -> None:
    """A report that recomputes a stale cache while an ingest replaces the same run: each
    reads one run (or says it could not, exit 2), and what is left is one run, whose cache, if
    any, is its own."""
    run = tmp_path / "run"
    shutil.copytree(runs.a, run)
    for round in range(rounds):
        for name in RANK_TABLES:  # stale: the report recomputes and writes the cache
            (run / f"{name}.parquet").unlink(missing_ok=True)
        ingest = _start("ingest", DDP, "-o", run)
        time.sleep(LAGS[round % len(LAGS)])  # (the report's recompute meets the swap somewhere)
        report = _start("report", "--json", run)
        for result in (_finish(report), _finish(ingest)):
            assert_clean(result)
        assert_one_run(run)
    # (a reader's temporary file made in the replaced run as the ingest removed it can keep that
    # folder: a dead ingest's leftover, which the next ingest removes)
    assert run_cli("ingest", DDP, "-o", run).code == 0
    assert R.leftovers(run) == []
    again = run_cli("report", "--json", run)
    assert again.code == 0, again.err
    assert again.json()["summary"] == runs.summary
    assert_one_run(run)


def check_two_ingests(runs: Runs, tmp_path: Path, rounds: int) -> None:
    """Two ingests into one -o at once (new, then existing): one complete run is left, and an
    ingest that found the other writing says so in one line (exit 2)."""
    run = tmp_path / "run"
    for _ in range(rounds):
        first, second = _start("ingest", DDP, "-o", run), _start("ingest", DDP, "-o", run)
        results = [_finish(first), _finish(second)]
        for result in results:
            assert_clean(result)
            if result.code == 2:
                assert "another traceview ingest is writing it" in result.err, result.err
        assert 0 in [r.code for r in results], [r.err for r in results]
        assert_one_run(run)
        assert R.leftovers(run) == []
        assert not run.with_name(f".{run.name}.lock").exists()
    report = run_cli("report", "--json", run)
    assert report.code == 0, report.err
    assert report.json()["summary"] == runs.summary


def check_recompute_of_a_replaced_run(runs: Runs, tmp_path: Path) -> None:
    """The race above, made certain in one process: a recompute of run a, whose run directory an
    ingest replaced (by run b) after it was first looked at, writes no cache (RunReplaced) and
    the run directory is run b's alone; opening it again reads b."""
    from traceview.runs import RunReplaced, open_run, reanalyze

    run = tmp_path / "run"
    shutil.copytree(runs.a, run)
    seen, manifest = R.identities(run), R.read_manifest(run)
    ingest_run([DDP], run)  # the swap, between the first look and the recompute
    for name in RANK_TABLES:
        (run / f"{name}.parquet").unlink()
    with pytest.raises(RunReplaced):
        reanalyze(run, manifest, seen)
    assert not any((run / f"{name}.parquet").exists() for name in RANK_TABLES)
    assert run_id(run) != manifest.run_id
    assert_one_run(run)
    with open_run([run]) as opened:
        assert opened.manifest.run_id == run_id(run)
    assert_one_run(run)
    assert all(cache_run_id(run / f"{name}.parquet") == run_id(run) for name in RANK_TABLES)
