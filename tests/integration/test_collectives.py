"""The integration tier's part of ``tests/unit/test_collectives.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SAMPLES, beyond_unit
from tests.unit.test_collectives import _every_rank_numbers_its_calls_the_same_way


@pytest.mark.parametrize(
    "sample",
    beyond_unit(
        ["pytorch/ddp", "pytorch/explicit", "tensorflow/mwms", "mxnet/dist_sync"],
        lambda s: (SAMPLES / s,),
    ),
)
def test_every_rank_numbers_its_calls_the_same_way(sample: str) -> None:
    _every_rank_numbers_its_calls_the_same_way(sample)


def test_collectives_table_is_in_the_export(tmp_path: Path) -> None:
    from tests.conftest import run_cli
    from traceview.runs import ingest_run

    run = ingest_run([SAMPLES / "pytorch" / "ddp"], tmp_path / "run")
    result = run_cli("export", run, "--format", "parquet", "-o", tmp_path / "out")
    assert result.code == 0, result.err
    exported = pl.read_parquet(tmp_path / "out" / "collectives.parquet")
    assert exported.height == 2 * 30
    # what matching found travels with each call: the gloo calls are matched (wait + transfer
    # is the call), c10d's launch calls are not (they return before the others arrive)
    gloo = exported.filter(pl.col("name") == "gloo:all_reduce")
    assert gloo["matched"].all() and gloo.height == 2 * 15
    # a gloo call arrives when the program issued it: the start of a c10d::allreduce_ on the
    # same rank, before the worker thread began it (issue 32); wait, queue and transfer make up
    # the call from there
    issued = exported.filter(pl.col("name") == "c10d::allreduce_").select("rank", "start_ns")
    assert (gloo["arrival_ns"] <= gloo["start_ns"]).all()
    assert gloo.join(
        issued.rename({"start_ns": "arrival_ns"}), on=["rank", "arrival_ns"], how="anti"
    ).is_empty()
    assert gloo["arrival_ns"].n_unique() == gloo.height
    assert (
        gloo["wait_ns"] + gloo["queued_ns"] + gloo["transfer_ns"]
        == gloo["end_ns"] - gloo["arrival_ns"]
    ).all()
    assert set(gloo["last_rank"].to_list()) <= {0, 1}
    assert not exported.filter(pl.col("name") == "c10d::allreduce_")["matched"].any()
    # text columns are typed alike in every exported table (not large_string in this one)
    import pyarrow as pa
    import pyarrow.parquet as pq

    for table in (tmp_path / "out").glob("*.parquet"):
        types = {f.type for f in pq.read_schema(table)}
        assert pa.large_string() not in types, table.name
