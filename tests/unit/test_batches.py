"""Many small ranks (issue 55): a pool task ingests a batch of small ranks, each as it is
ingested alone (a rank that cannot be read left out alone, with its warning), and the run is the
one a single process writes; a small trace is read whole, not in chunks, unless the tests of the
chunks ask for them (``TRACEVIEW_WHOLE_RANK=0``)."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.synthetic_jobs import Job, write
from traceview.analysis import RANK_TABLES, rank_tables
from traceview.ingest import batches as B
from traceview.ingest import rank as rank_module
from traceview.ingest.discover import TraceFile, assign_ranks, discover
from traceview.ingest.rank import ingest_rank
from traceview.model.errors import BadInput, Notes
from traceview.runs import ingest_run
from traceview.store import rundir as R


def _traces(sizes: list[int], name: str = "rank-{}.pt.trace.json.gz") -> list[TraceFile]:
    return [
        TraceFile(Path(name.format(i)), "kineto", "pytorch", rank=i, size=size)
        for i, size in enumerate(sizes)
    ]


def test_small_ranks_go_several_to_a_task_in_the_order_given() -> None:
    traces = _traces([500] * 20_000)
    tasks = B.batches(traces, 2)
    assert [t for task in tasks for t in task] == traces
    assert max(len(task) for task in tasks) == B.BATCH_RANKS
    # fewer ranks: smaller tasks, so that each worker still has several
    tasks = B.batches(traces[:100], 2)
    assert len(tasks) >= 2 * B.TASKS_PER_WORKER
    assert [t for task in tasks for t in task] == traces[:100]
    assert B.batches(traces[:3], 2) == [[t] for t in traces[:3]]


def test_a_large_trace_is_a_task_of_its_own() -> None:
    big = B.BATCH_BYTES // 8 + 1  # (gzip: counts 8 times)
    traces = _traces([big, 400, big, *[400] * 300])
    tasks = B.batches(traces, 1)
    assert tasks[0] == [traces[0]]
    assert tasks[1] == [traces[1]]  # (the next one would pass the bytes a task takes)
    assert tasks[2][0] == traces[2] and len(tasks[2]) == 1
    assert len(tasks[3]) > 1
    plain = _traces([B.BATCH_BYTES - 1, 2], name="rank-{}.json")
    assert B.batches(plain, 1) == [[plain[0]], [plain[1]]]


def _only_metadata(trace: Path) -> None:
    """``trace`` (a rank's Kineto trace) with its timed events left out: found as a rank, then
    left out when it is read (it holds no timed events)."""
    data = json.loads(gzip.decompress(trace.read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if e["ph"] == "M"]
    trace.write_bytes(gzip.compress(json.dumps(data).encode()))


def _tables(run: Path) -> dict[str, pa.Table]:
    return {name: R.read_table(run / f"{name}.parquet") for name in RANK_TABLES}


def test_a_batch_returns_each_ranks_part_or_error_in_place(tmp_path: Path) -> None:
    folder = write(Job(ranks=4, steps=2), tmp_path / "traces")
    _only_metadata(folder / "rank-1.pt.trace.json.gz")
    notes = Notes()
    traces = sorted(discover([folder], notes), key=lambda t: t.rank)
    assign_ranks(traces, notes)
    alone = tmp_path / "alone"
    alone.mkdir()
    run_id = uuid.uuid4().hex[:12]
    parts = [ingest_rank(t, alone, run_id, None, rank_tables) for t in traces if t.rank != 1]
    batched = tmp_path / "batched"
    batched.mkdir()
    results = B.ingest_ranks(traces, batched, run_id, None, rank_tables)
    assert [type(r) is BadInput for r in results] == [False, True, False, False]
    with pytest.raises(BadInput, match="no timed events"):
        B.given(results[1])
    kept = [B.given(r) for r in results if not isinstance(r, BadInput)]
    assert [p.rank for p in kept] == [0, 2, 3]
    for name in RANK_TABLES:  # each table of the batch once, in the first part: the ranks' rows
        assert name in kept[0].tables and all(name not in p.tables for p in kept[1:])
        expected = pa.concat_tables([p.tables[name] for p in parts])  # type: ignore[misc]
        assert kept[0].tables[name].equals(expected), name
    assert [p.info.events for p in kept] == [p.info.events for p in parts]


def test_a_pool_of_batches_writes_the_run_one_process_writes(tmp_path: Path) -> None:
    """40 one-step ranks (enough for a pool of workers), one that cannot be read: on two
    workers, a few ranks a task, it is left out alone with its warning, and the run is the one
    a single process writes."""
    folder = write(Job(ranks=40, steps=1), tmp_path / "traces")
    _only_metadata(folder / "rank-7.pt.trace.json.gz")
    done: list[int] = []

    def progress(stage: str, count: int, total: int | None = None) -> None:
        if stage == "ingesting ranks":
            done.append(count)

    pooled = ingest_run([folder], tmp_path / "pooled", jobs=2, progress=progress)
    alone = ingest_run([folder], tmp_path / "alone", jobs=1)
    assert done == list(range(41))  # every rank counted as it is done
    a, b = R.read_manifest(pooled), R.read_manifest(alone)
    assert [r.rank for r in a.ranks] == [r for r in range(40) if r != 7]
    assert a.notes == b.notes
    assert sum("rank 7 left out" in w for w in a.notes.warnings) == 1
    assert [(r.rank, r.events, r.steps) for r in a.ranks] == [
        (r.rank, r.events, r.steps) for r in b.ranks
    ]
    theirs = _tables(alone)
    for name, table in _tables(pooled).items():
        ids = [c for c in ("run_id",) if c in table.column_names]
        assert table.drop_columns(ids).equals(theirs[name].drop_columns(ids)), name


def test_a_small_trace_is_read_whole_unless_chunks_are_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = Path("rank-0.pt.trace.json.gz")
    monkeypatch.delenv("TRACEVIEW_WHOLE_RANK", raising=False)
    monkeypatch.delenv("TRACEVIEW_WHOLE_BELOW_BYTES", raising=False)
    below = rank_module.WHOLE_BELOW_BYTES
    assert rank_module.read_whole(small, below // 8 - 1)
    assert not rank_module.read_whole(small, below // 8)
    assert rank_module.read_whole(Path("rank-0.json"), below - 1)
    assert not rank_module.read_whole(Path("rank-0.json"), below)
    monkeypatch.setenv("TRACEVIEW_WHOLE_BELOW_BYTES", "0")
    assert not rank_module.read_whole(small, 1)
    monkeypatch.delenv("TRACEVIEW_WHOLE_BELOW_BYTES")
    monkeypatch.setenv("TRACEVIEW_WHOLE_RANK", "0")  # (the tests of the chunks)
    assert not rank_module.read_whole(small, 1)

    folder = write(Job(ranks=1, steps=2), tmp_path / "traces")
    chunked: list[Path] = []
    real = rank_module._ingest_chunked

    def counting(trace: TraceFile, *args, **kwargs):  # type: ignore[no-untyped-def]
        chunked.append(trace.path)
        return real(trace, *args, **kwargs)

    monkeypatch.setattr(rank_module, "_ingest_chunked", counting)
    ingest_run([folder], tmp_path / "chunks", jobs=1)
    assert len(chunked) == 1
    monkeypatch.delenv("TRACEVIEW_WHOLE_RANK")
    ingest_run([folder], tmp_path / "whole", jobs=1)
    assert len(chunked) == 1  # read whole
