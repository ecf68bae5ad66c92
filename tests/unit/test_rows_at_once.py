"""The per-event tables (ops, collectives, actions) of a batch of ranks made at once
(``RankTables.rows``, what ``ingest.batches`` does for small ranks) are each rank's own tables,
row for row: ranks of different jobs and frameworks in one batch, in any order, whose threads,
process groups, operator names and event ids collide, FSDP units, gloo's worker threads and
pipeline actions included."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.unit.test_fsdp import CPU_FORWARD
from traceview.analysis import rank_tables
from traceview.ingest.discover import assign_ranks, discover
from traceview.ingest.rank import ingest_rank
from traceview.model import schema as S
from traceview.model.errors import Notes
from traceview.normalize.pipeline import RankMeta, normalize
from traceview.normalize.rules import builtin_rules
from traceview.store import rundir as R

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
FOLDERS = [
    "pytorch/ddp",
    "pytorch/explicit",
    "pytorch/gpu_ddp_nccl",
    "pytorch/gpu_explicit_nccl",
    "pytorch/gpu_async",
    "pytorch/slowio",
    "mxnet/dist_sync",
    "mxnet/dist_overlap_bulk",
    "chainer/mlp",
]
ROW_TABLES = ("ops", "collectives", "actions")


def _normalized(folder: Path, run: Path) -> list[pa.Table]:
    """Each rank's normalized events, as ingest writes them (``ingest_rank``, no analysis)."""
    traces = discover([folder], Notes(), False, lambda *a: None)
    assign_ranks(traces, Notes())
    for trace in traces:
        ingest_rank(trace, run, "t", None, None)
    return [R.read_events(run, [trace.rank]) for trace in traces]


def _as_rank(events: pa.Table, rank: int) -> pa.Table:
    at = events.schema.get_field_index(S.RANK)
    ranks = pa.array([rank] * events.num_rows, pa.int32())
    return S.conform(events.set_column(at, S.RANK, ranks), S.EVENTS_SCHEMA)


def _pipeline_rank(rank: int) -> pa.Table:
    """A rank of a pipeline: PP: actions around its operators, and a send and a receive."""
    from tests.unit.test_attribution import ev, step

    events = [step(1, 0, 1000)]
    for i, name in enumerate(["PP:0F0", "PP:0F1", "PP:2B1", "PP:0SEND_F0", "PP:0W1"]):
        events.append(ev(name, 10 + 100 * i, 80, kind=S.KIND_ANNOTATION))
        events.append(ev("aten::linear", 20 + 100 * i, 40))
    table = S.conform(pa.Table.from_pylist(events), S.RAW_SCHEMA)
    return normalize(table, builtin_rules("pytorch"), RankMeta("t", rank, "pytorch")).events


def _fsdp_rank(rank: int, shift: int) -> pa.Table:
    from tests.unit.test_attribution import ev

    events = [{**e, S.TS_NS: e[S.TS_NS] + shift} for e in CPU_FORWARD]
    events.append(ev("aten::mm", 600 + shift // 1000, 30))
    table = S.conform(pa.Table.from_pylist(events), S.RAW_SCHEMA)
    return normalize(table, builtin_rules("pytorch"), RankMeta("t", rank, "pytorch")).events


def _tie_rank(rank: int, first: str, second: str) -> pa.Table:
    """Two operators of the same self time, in the order given: a tie the rank's own order of
    first appearance breaks."""
    from tests.unit.test_attribution import ev, step

    events = [step(1, 0, 1000), ev(first, 10, 50), ev(second, 100, 50), ev(first, 200, 50)]
    events.append(ev(second, 300, 50))
    table = S.conform(pa.Table.from_pylist(events), S.RAW_SCHEMA)
    return normalize(table, builtin_rules("pytorch"), RankMeta("t", rank, "pytorch")).events


def _group_rank(rank: int, group: str) -> pa.Table:
    """gloo's worker thread (the same thread id on every rank) running calls whose host calls
    name a process group: the thread takes its rank's group."""
    from tests.unit.test_attribution import GLOO, ev, step

    events = [step(1, 0, 1000)]
    for i in range(3):
        issue = ev("c10d::allreduce_", 100 + 200 * i, 10)
        events += [{**issue, S.GROUP: group}, ev("gloo:all_reduce", 105 + 200 * i, 80, tid=GLOO)]
    events = [{S.GROUP: None, **e} for e in events]  # (a column from_pylist sees in every row)
    table = S.conform(pa.Table.from_pylist(events), S.RAW_SCHEMA)
    return normalize(table, builtin_rules("pytorch"), RankMeta("t", rank, "pytorch")).events


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[pa.Table]:
    """Ranks of every sample job above, FSDP and pipeline ranks, each given a rank of its own."""
    found: list[pa.Table] = []
    for folder in FOLDERS:
        if (SAMPLES / folder).exists():
            found += _normalized(SAMPLES / folder, tmp_path_factory.mktemp("run"))
    found += [_fsdp_rank(0, 0), _fsdp_rank(0, 5_000), _pipeline_rank(0), _pipeline_rank(0)]
    found += [_tie_rank(0, "aten::add", "aten::mul"), _tie_rank(0, "aten::mul", "aten::add")]
    found += [_group_rank(0, "pg:a"), _group_rank(0, "pg:b"), _group_rank(0, "pg:b")]
    return [_as_rank(events, 100 + i) for i, events in enumerate(found)]


def _alone(events: pa.Table) -> dict[str, pa.Table]:
    tables = rank_tables(events)
    return {name: tables[name] for name in ROW_TABLES}


def _by_rank(table: pa.Table) -> dict[int, pa.Table]:
    ranks = table.column(S.RANK).to_pylist()
    return {
        rank: table.filter(pc.equal(table.column(S.RANK), rank)) for rank in dict.fromkeys(ranks)
    }


def test_the_corpus_has_what_the_batch_must_keep_apart(ranks: list[pa.Table]) -> None:
    alone = [_alone(events) for events in ranks]
    assert sum(t["collectives"].num_rows > 0 for t in alone) >= 8
    assert sum(t["actions"].num_rows > 0 for t in alone) >= 2
    units = [t["collectives"].column(S.UNIT).drop_null() for t in alone]
    assert sum(len(u) > 0 for u in units) >= 2  # (FSDP)
    issued = [t["collectives"].column(S.ISSUED_NS).drop_null() for t in alone]
    assert sum(len(i) > 0 for i in issued) >= 3  # (gloo's worker threads, linked)
    # a worker's run takes its rank's group, from its host calls
    groups = {
        tuple(t["collectives"].filter(pc.equal(t["collectives"].column(S.NAME), "gloo:all_reduce"))
              .column(S.GROUP).to_pylist())
        for t in alone[-3:]
    }  # fmt: skip
    assert groups == {("pg:a",) * 3, ("pg:b",) * 3}
    # ties in self time go to the operator the rank saw first
    ties = [t["ops"].column(S.OP).to_pylist()[:2] for t in alone[-5:-3]]
    assert ties[0] == ties[1][::-1]


@pytest.mark.parametrize("seed", [-2, -1, *range(6)])
def test_a_batch_of_ranks_gives_each_rank_its_own_rows(ranks: list[pa.Table], seed: int) -> None:
    rng = random.Random(seed)
    if seed < 0:  # every rank, in order and reversed
        batch = ranks if seed == -2 else ranks[::-1]
    else:
        batch = rng.sample(ranks, k=rng.randint(2, len(ranks)))
    together = rank_tables.rows(batch)
    for name in ROW_TABLES:
        # the batch's rows: rank after rank (the run's tables are ordered by rank later, each
        # rank's rows kept in their order), each rank's in its own order
        expected = pa.concat_tables([_alone(events)[name] for events in batch])
        got = together[name]
        assert got.schema.equals(expected.schema), name
        seen = got.column(S.RANK).to_pylist()
        runs = [r for i, r in enumerate(seen) if i == 0 or seen[i - 1] != r]
        assert len(runs) == len(set(runs)), name  # (each rank's rows together)
        mine, theirs = _by_rank(got), _by_rank(expected)
        assert mine.keys() == theirs.keys(), name
        for rank in theirs:
            assert mine[rank].equals(theirs[rank]), (name, rank)


def test_one_rank_alone_is_the_whole_analysis(ranks: list[pa.Table]) -> None:
    for events in ranks[:6]:
        together = rank_tables.rows([events])
        alone = _alone(events)
        for name in ROW_TABLES:
            assert together[name].equals(alone[name]), name


def test_no_rank_gives_every_table_empty() -> None:
    """(A batch of servers alone: each keeps every table, empty.)"""
    tables = rank_tables.rows([])
    assert set(tables) == set(ROW_TABLES) and all(t.num_rows == 0 for t in tables.values())
    assert tables["ops"].schema.equals(S.OPS_SCHEMA)


@pytest.mark.parametrize("job", ["mxnet/dist_sync", "pytorch/ddp", "chainer/mlp"])
def test_a_batch_ingests_each_rank_as_alone(job: str, tmp_path: Path) -> None:
    """``ingest_ranks`` (a pool's task of small ranks) against each rank ingested alone: the
    same tables, rank by rank, a parameter server's (every table kept, empty) included."""
    from traceview.ingest.batches import ingest_ranks
    from traceview.ingest.rank import RankPartial

    traces = discover([SAMPLES / job], Notes(), False, lambda *a: None)
    assign_ranks(traces, Notes())
    if job.startswith("mxnet"):  # (its rank 1 as collect records a server)
        traces[1].role = "server"
    batch = ingest_ranks(traces, tmp_path / "batch", "t", None, rank_tables)
    parts = [p for p in batch if isinstance(p, RankPartial)]
    assert len(parts) == len(traces) and all(p.events is None for p in parts)
    if job.startswith("mxnet"):
        assert [p.info.role for p in parts].count("server") == 1
        (server,) = ingest_ranks([traces[1]], tmp_path / "servers", "t", None, rank_tables)
        assert isinstance(server, RankPartial)
        assert set(server.tables) == set(parts[0].tables)  # (a batch of servers alone)
        assert all(t.num_rows == 0 for n, t in server.tables.items() if n in ROW_TABLES)
    together: dict[str, pa.Table] = {}
    for part in parts:
        for name, table in part.tables.items():
            together[name] = (
                pa.concat_tables([together[name], table]) if name in together else table
            )
    for trace in traces:
        alone = ingest_rank(trace, tmp_path / "alone", "t", None, rank_tables).tables
        assert set(alone) == set(together)
        for name, table in alone.items():
            mine = together[name].filter(pc.equal(together[name].column(S.RANK), trace.rank))
            assert mine.equals(table), (job, trace.rank, name)
