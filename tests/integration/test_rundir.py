"""The integration tier's part of ``tests/unit/test_rundir.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import SAMPLES, Result, run_cli
from tests.unit.test_rundir import _copy
from traceview.collectors.rankside import rank_dir
from traceview.model.errors import BadInput
from traceview.runs import _TABLE_SCHEMAS, PATH_CACHE, finished, ingest_run, open_run
from traceview.store import rundir as R


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingest_run([SAMPLES / "pytorch" / "ddp"], tmp_path_factory.mktemp("rundir") / "run")


def test_nesting_bombs_are_one_line_errors_or_warnings(fresh: Path, tmp_path: Path) -> None:
    """JSON nested past the parser's depth: a manifest is bad input (exit 2, one line); a
    rank's status file is not used, with a warning, and the trace is read all the same."""
    from tests.conftest import run_cli

    bomb = "[" * 100_000 + "]" * 100_000
    run = _copy(fresh, tmp_path)
    (run / R.MANIFEST).write_text(bomb)
    result = run_cli("report", run)
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SAMPLES / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz", traces)
    (traces / "status.json").write_text('{"rank": 0, "clock": ' + bomb + "}")
    result = run_cli("report", traces, "--json")
    assert result.code == 0, result.err
    assert any("status.json: unreadable" in w for w in result.json()["warnings"])


@pytest.mark.parametrize("umask", ["022", "027", "077"])
def test_files_honour_the_umask(tmp_path: Path, umask: str) -> None:
    """Run directories and exports are created as any tool creates files: 0666 and 0777 less
    the umask (they were 0600 files in 0755 folders: unreadable by others on a shared cluster)."""
    import os
    import stat
    import subprocess
    import sys

    run, out = tmp_path / "run", tmp_path / "out"
    script = (
        f"umask {umask} && {sys.executable} -m traceview ingest {SAMPLES / 'pytorch' / 'explicit'}"
        f" -o {run} && {sys.executable} -m traceview export {run} --format parquet -o {out}"
    )
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    mask = int(umask, 8)
    paths = [p for p in [*run.rglob("*"), *out.rglob("*")]]
    assert any(p.is_file() for p in paths) and any(p.is_dir() for p in paths)
    for path in paths:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert mode == expected, (path, oct(mode), oct(expected))


def test_local_workers_die_with_a_killed_ingest(tmp_path: Path) -> None:
    """Killing a multi-rank ingest (SIGKILL: no cleanup runs) used to leave its pool's workers
    (~180 MB each) and the resource tracker running. They now die with it."""
    import gzip
    import signal
    import subprocess
    import sys
    import time

    text = gzip.decompress(
        (SAMPLES / "pytorch" / "slowfwd" / "rank-0.pt.trace.json.gz").read_bytes()
    )
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in range(int(80e6 // len(text)) + 1):  # past the size ingest runs a pool for
        (traces / f"rank-{rank}.pt.trace.json").write_bytes(
            text.replace(b'"rank": 0,', f'"rank": {rank},'.encode(), 1)
        )
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceview", "ingest", str(traces), "-o", str(tmp_path / "run"),
         "--jobs", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def children() -> list[int]:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True)
        return [int(pid) for pid in out.stdout.split()]

    deadline = time.monotonic() + 60
    while len(children()) < 2:  # the resource tracker and at least one worker
        assert proc.poll() is None and time.monotonic() < deadline, "no pool started"
        time.sleep(0.1)
    workers = children()
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    def running(pid: int) -> bool:
        try:
            return b"zombie" not in Path(f"/proc/{pid}/status").read_bytes().lower()
        except OSError:
            return False

    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in workers if running(pid)]
    assert not alive, f"workers outlived the ingest: {alive}"


def _run_with_raw(tmp_path: Path) -> Path:
    """A run directory as `collect` leaves it: the raw traces under raw/, ingested."""
    run = tmp_path / "run"
    assert run_cli("ingest", SAMPLES / "pytorch" / "ddp", "-o", run).code == 0
    for rank in (0, 1):
        raw = rank_dir(run, rank)
        raw.mkdir(parents=True)
        shutil.copy(SAMPLES / "pytorch" / "ddp" / f"rank-{rank}.pt.trace.json.gz", raw)
    assert run_cli("ingest", run, "-o", run).code == 0
    return run


def _raw_intact(run: Path) -> bool:
    return all(
        (rank_dir(run, r) / f"rank-{r}.pt.trace.json.gz").read_bytes()
        == (SAMPLES / "pytorch" / "ddp" / f"rank-{r}.pt.trace.json.gz").read_bytes()
        for r in (0, 1)
    )


@pytest.mark.parametrize("point", ["ingest:staged", "replace:linked", "replace:exchanged"])
def test_a_reingest_killed_at_any_step_leaves_a_whole_run(tmp_path: Path, point: str) -> None:
    run = _run_with_raw(tmp_path)
    before = run_cli("report", "--json", run).json()["summary"]
    killed = run_cli("ingest", run, "-o", run, env={"TRACEVIEW_FAULT": point})
    assert killed.code == -signal.SIGKILL, killed.err
    assert R.leftovers(run), "the kill should have left the new run's staging folder"
    after = run_cli("report", "--json", run)
    assert after.code == 0, after.err
    assert after.json()["summary"] == before
    assert _raw_intact(run)
    again = run_cli("ingest", run, "-o", run)  # cleans up after the killed one
    assert again.code == 0, again.err
    assert R.leftovers(run) == [] and _raw_intact(run)


def test_a_reingest_killed_between_two_renames_is_repaired(tmp_path: Path) -> None:
    """Without an atomic exchange (other systems, some file systems) the previous run is parked
    for an instant; a kill there leaves no run, which the next ingest puts back."""
    run = _run_with_raw(tmp_path)
    before = run_cli("report", "--json", run).json()["summary"]
    fault = {"TRACEVIEW_FAULT": "replace:parked", "TRACEVIEW_NO_EXCHANGE": "1"}
    assert run_cli("ingest", run, "-o", run, env=fault).code == -signal.SIGKILL
    assert not run.exists()
    report = run_cli("report", run)
    assert report.code == 2 and "the previous run is at .run.old-" in report.err, report.err
    assert len(report.err.strip().splitlines()) == 1
    again = run_cli("ingest", run, "-o", run)
    assert again.code == 0, again.err
    assert "restored the previous run" in again.err
    assert run_cli("report", "--json", run).json()["summary"] == before
    assert R.leftovers(run) == [] and _raw_intact(run)


def test_an_output_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("not a run\n")
    result = run_cli("ingest", SAMPLES / "pytorch" / "ddp", "-o", target)
    assert result.code == 2 and "is a file" in result.err and "internal" not in result.err
    assert target.read_text() == "not a run\n"


def _alien_table(path: Path, column: str = "a", value: object = 1) -> None:
    pq.write_table(pa.table({column: [value]}), path)


@pytest.mark.parametrize("name", ["steps", "ops", "collectives", "comm"])
def test_a_cached_table_of_another_shape_is_recomputed(
    fresh: Path, tmp_path: Path, name: str
) -> None:
    run = _copy(fresh, tmp_path)
    before = run_cli("report", "--json", run).json()["summary"]
    _alien_table(run / f"{name}.parquet", "step", "not a number")
    result = run_cli("report", "--json", run)
    assert result.code == 0, result.err
    assert result.json()["summary"] == before
    assert R.read_table(run / f"{name}.parquet").schema.equals(_TABLE_SCHEMAS[name])  # mended


def test_a_rank_whose_events_are_foreign_is_left_out_the_others_kept(
    fresh: Path, tmp_path: Path
) -> None:
    run = _copy(fresh, tmp_path)
    _alien_table(run / "comm.parquet")  # the cache must be recomputed from the events...
    _alien_table(R.events_path(run, 1))  # ...and rank 1's are not traceview's
    result = run_cli("report", "--json", run)
    assert result.code == 0, result.err
    report = result.json()
    assert [r["rank"] for r in report["ranks"]] == [0]
    assert [w for w in report["warnings"] if "rank=1" in w and "left out" in w]
    assert not [w for w in report["warnings"] if "no step window" in w]
    # export leaves the rank out as report does, and says so in one line (issue 36)
    export = run_cli("export", run, "-o", tmp_path / "out")
    assert export.code == 0 and "rank=1" in export.err and len(export.err.splitlines()) == 1
    assert "rank 1's events left out" in export.err


def test_folders_that_are_not_rank_partitions_are_not_read(fresh: Path, tmp_path: Path) -> None:
    run = _copy(fresh, tmp_path)
    stray = run / "events" / "rank=abc"
    stray.mkdir()
    shutil.copy(R.events_path(run, 0), stray)
    assert R.event_ranks(run) == [0, 1]
    assert run_cli("report", run).code == 0


@pytest.mark.parametrize("where", ["top", "collect"])
def test_a_claimed_world_of_ten_billion_ranks_allocates_nothing(
    fresh: Path, tmp_path: Path, where: str
) -> None:
    run = _copy(fresh, tmp_path)
    manifest = json.loads((run / R.MANIFEST).read_text())
    if where == "top":
        manifest["world_size"] = 10**10
    else:
        manifest["collect"] = {"world_size": 10**10, "ranks": []}
    (run / R.MANIFEST).write_text(json.dumps(manifest))
    result = run_cli("report", run)
    assert result.code == 2, result.err  # the run directory's record is wrong: one line
    assert "world_size" in result.err and len(result.err.strip().splitlines()) == 1


def _computed(*options: str, run: Path) -> Result:
    """``report`` of ``run`` computed, not the report a run keeps (runs/finished.py): what
    reading the run's cached tables and critical path gives."""
    (run / finished.REPORT_CACHE).unlink(missing_ok=True)
    return run_cli("report", *options, run)


def test_a_reports_critical_path_is_kept_for_the_next_one(fresh: Path, tmp_path: Path) -> None:
    """The critical path (most of what `report` costs at 1,024 ranks) is kept in the run
    directory, per choice of steps and changes, recording the key of the tables it came from:
    the next report reads it (a kept figure, changed by hand, is what it prints), a report of
    other steps adds its own entry, and once the events change (another key) or the file is
    damaged it is computed again."""
    run = _copy(fresh, tmp_path)
    kept = run / PATH_CACHE
    kept.unlink(missing_ok=True)
    first = _computed("--json", run=run).json()
    key, entries = json.loads(kept.read_bytes())
    assert len(entries) == 1
    (entry,) = entries.values()
    assert entry["path"]["step_ms"] == first["critical_path"]["step_ms"]
    entry["path"]["step_ms"] = 12345.0
    kept.write_text(json.dumps([key, entries]))
    assert _computed("--json", run=run).json()["critical_path"]["step_ms"] == 12345.0
    _computed("--json", "--steps", "2-3", run=run)
    run_cli("whatif", run, "--faster", "backward:2")
    assert len(json.loads(kept.read_bytes())[1]) == 3
    kept.write_text("{not json")
    assert _computed("--json", run=run).json()["critical_path"] == first["critical_path"]
    kept.write_text(json.dumps([key, entries]))  # the changed figure again, then new events
    events = next((run / R.EVENTS).rglob("*.parquet"))
    stat = events.stat()
    os.utime(events, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = _computed("--json", run=run).json()
    assert again["critical_path"] == first["critical_path"]
    assert json.loads(kept.read_bytes())[0] != key


def test_segments_read_after_the_run_was_replaced_are_the_runs_as_it_was_opened(
    fresh: Path, tmp_path: Path
) -> None:
    """A report reads the segments (the largest table) only where it computes the critical
    path, after the other tables: through the file opened with them, so that an ingest that
    replaces the run meanwhile (a new file renamed over the old) is not mixed into it."""
    run = _copy(fresh, tmp_path)
    (run / PATH_CACHE).unlink(missing_ok=True)
    with open_run([run]) as opened:
        expected = opened.report().critical_path
    (run / PATH_CACHE).unlink()
    segments = run / "segments.parquet"
    table = pq.read_table(segments)
    later = table.filter(pa.compute.equal(table.column("rank"), 0))  # another run's: one rank
    with open_run([run]) as opened:
        pq.write_table(later, tmp_path / "new.parquet")
        os.replace(tmp_path / "new.parquet", segments)
        path = opened.report().critical_path
    assert expected is not None and path == expected


def test_segments_whose_pages_are_damaged_are_computed_again_when_a_report_needs_them(
    fresh: Path, tmp_path: Path
) -> None:
    """The segments are read only when a report computes the critical path: a file whose
    footer is whole (it opens) but whose pages are damaged is then, as any damaged cache, only
    a cache: the tables are computed again from the events, and the report is the run's."""
    run = _copy(fresh, tmp_path)
    (run / PATH_CACHE).unlink(missing_ok=True)
    first = run_cli("report", "--json", run).json()
    (run / PATH_CACHE).unlink()
    segments = run / "segments.parquet"
    data = bytearray(segments.read_bytes())
    data[4 : len(data) // 2] = bytes(len(data) // 2 - 4)  # the first pages' headers, zeroed
    segments.write_bytes(bytes(data))
    with pytest.raises(BadInput):  # (the damage is in the pages: the file opens, reads fail)
        R.read_table(segments)
    result = run_cli("report", "--json", run)
    assert result.code == 0, result.err
    assert result.json()["critical_path"] == first["critical_path"]
    assert R.read_table(segments).num_rows > 0  # the cache written again


@pytest.mark.parametrize("writable", [True, False])
def test_a_recomputed_analysis_keeps_its_segments_in_a_file_and_leaves_none_behind(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writable: bool
) -> None:
    """A reader that computes the analysis again (here its segments are missing) spills each
    rank's segments and reads them back a row group at a time: from the cache it writes, or,
    where the run cannot be written, from a file of its own that it removes. The report is
    the original run's, and nothing is left in the temporary folder."""
    from tests.collect_faults import tmpfs

    (fresh / PATH_CACHE).unlink(missing_ok=True)
    first = run_cli("report", "--json", fresh).json()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    with contextlib.ExitStack() as stack:
        where = stack.enter_context(tmpfs(tmp_path / "fs", "64m")) if not writable else tmp_path
        run = _copy(fresh, where)
        (run / PATH_CACHE).unlink(missing_ok=True)
        (run / "segments.parquet").unlink()
        if not writable:  # (root writes into a folder whatever its mode: a read-only mount)
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        result = run_cli("report", "--json", run)
        written = (run / "segments.parquet").read_bytes() if writable else None
        assert writable or not (run / "segments.parquet").exists()
    assert result.code == 0, result.err
    assert result.json()["critical_path"] == first["critical_path"]
    assert result.json()["per_step"] == first["per_step"]
    assert list(temporary.iterdir()) == []
    if writable:  # the cache written again, as the ingest wrote it
        assert written == (fresh / "segments.parquet").read_bytes()


def test_segments_damaged_after_their_first_row_groups_are_read_then_computed_again(
    fresh: Path, tmp_path: Path
) -> None:
    """The critical path reads the segments a row group at a time: where a later group's
    pages are damaged, the groups read stand and the rest of the rows are computed again, so
    the report is the run's (none lost, none twice)."""
    run = _copy(fresh, tmp_path)
    (run / PATH_CACHE).unlink(missing_ok=True)
    first = _computed("--json", run=run).json()
    (run / PATH_CACHE).unlink()
    segments = run / "segments.parquet"
    table = pq.read_table(segments)
    assert table.num_rows >= 8
    pq.write_table(table, segments, row_group_size=table.num_rows // 4)  # (its key kept)
    meta = pq.ParquetFile(segments).metadata
    assert meta.num_row_groups >= 4
    column = meta.row_group(2).column(0)
    start = min(o for o in (column.dictionary_page_offset, column.data_page_offset) if o)
    footer = len(segments.read_bytes()) - 8 - meta.serialized_size
    data = bytearray(segments.read_bytes())
    data[start:footer] = bytes(footer - start)  # the third group on, zeroed
    segments.write_bytes(bytes(data))
    file = pq.ParquetFile(segments)
    assert file.read_row_group(0).num_rows == table.num_rows // 4  # the first groups read ...
    with pytest.raises(OSError):  # ... the third does not
        file.read_row_group(2)
    result = _computed("--json", run=run)
    assert result.code == 0, result.err
    assert result.json()["critical_path"] == first["critical_path"]
