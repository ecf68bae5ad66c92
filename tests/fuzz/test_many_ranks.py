"""A folder of 20,000 tiny traces (one step each, as a large job's ranks can be: the synthetic
data-parallel job of tests/synthetic_jobs.py): looking at the
files is linear and every rank is ingested, within a time bound far from a hang and in memory
that follows the rows, not the number of ranks (summed over traceview's processes, sampled while
it runs); a folder of 20,000 files that are not traces is looked at, counted and refused quickly.
``python -m pytest -m fuzz tests/fuzz/test_many_ranks.py`` (about 5 minutes on 2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import run_cli
from tests.synthetic_jobs import Job, write

RANKS = 20_000
#: 15-23 ms of CPU a rank: 530 s on 2 cores under load (468 s of CPU); a hang never ends.
INGEST_BOUND_S = 1800
#: The parent held ~130 KB a rank before parts were folded (2.7 GB at 20,000 ranks); workers
#: each hold one small rank.
PEAK_RSS_BOUND = 1200 << 20


def _tree_rss(root: int) -> int:
    """The resident memory of ``root`` and its descendants, now (from /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parents.items() if parent == pid and p not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(rss.get(p, 0) for p in tree)


def test_twenty_thousand_one_step_ranks_ingest_in_bounded_time_and_memory(tmp_path: Path) -> None:
    job = Job(ranks=RANKS, steps=1)
    folder = write(job, tmp_path / "traces")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceview", "ingest", str(folder), "-o", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    peak = 0
    sampler_done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not sampler_done.wait(0.5):
            peak = max(peak, _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=INGEST_BOUND_S)
    finally:
        sampler_done.set()
        sampler.join()
        proc.kill()
    took = time.monotonic() - started
    assert proc.returncode == 0, err
    assert f"{RANKS} rank(s)" in out, out
    assert peak < PEAK_RSS_BOUND, f"peak {peak >> 20} MB over {took:.0f} s"
    report = run_cli("report", "--json", tmp_path / "run")
    assert report.code == 0, report.err
    data = report.json()
    assert data["run"]["ranks"] == RANKS and data["run"]["missing_ranks"] == []
    # every rank's step is known: its last arrival, the transfer and the update
    step_ms = max(job.arrival(r) for r in range(RANKS)) + job.transfer_ms + job.update_ms
    assert abs(data["summary"]["step_ms"] - step_ms) < 0.01, (data["summary"], step_ms)


def test_twenty_thousand_files_that_are_not_traces_are_counted_and_refused(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(RANKS):
        (folder / f"note-{i}.txt").write_text("not a trace\n")
    started = time.monotonic()
    result = run_cli("report", folder)
    took = time.monotonic() - started
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "no traces found" in lines[0], result.err
    assert took < 120, f"looking at {RANKS} files took {took:.0f} s"
