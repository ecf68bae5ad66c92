"""export's collectives carry each call's process group as the trace declares it (issue 32): the
columns of schema.EXPORT_COLLECTIVES_SCHEMA, typed as it says, on the bundled DDP sample (one
group: the world). Multi-group jobs: tests/live/test_parallel_views.py."""

from __future__ import annotations

import gzip
import json

import pyarrow.compute as pc

from tests.conftest import SAMPLES
from traceview.model import schema as S
from traceview.runs import Run
from traceview.views import export


def test_collectives_columns_are_the_documented_ones_and_name_the_declared_group(ddp: Run) -> None:
    table = export._plain_strings(ddp.export_tables()["collectives"])  # as written
    base = list(S.COLLECTIVES_SCHEMA)
    at = [f.name for f in base].index(S.DEVICE) + 1
    documented = [*base[:at], S.EXPORT_COLLECTIVES_SCHEMA.field(S.VIEW), *base[at:]]
    extra = [f for f in S.EXPORT_COLLECTIVES_SCHEMA if f.name != S.VIEW]
    expected = [(f.name, f.type) for f in [*documented, *extra]]
    assert [(f.name, f.type) for f in table.schema] == expected
    # the group each rank's trace declares (distributedInfo.pg_config), read from the raw JSON
    declared = set()
    for path in sorted((SAMPLES / "pytorch" / "ddp").glob("rank-*.json.gz")):
        with gzip.open(path, "rt") as f:
            for pg in json.load(f)["distributedInfo"]["pg_config"]:
                declared.add((pg["pg_name"], tuple(pg["ranks"])))
    host = table.filter(pc.equal(table.column(S.VIEW), "host"))
    named = {
        (g, tuple(r))
        for g, r in zip(
            host.column(S.GROUP).to_pylist(), host.column(S.GROUP_RANKS).to_pylist(), strict=True
        )
        if g is not None
    }
    assert named and named <= declared
    assert set(host.column(S.DIM).to_pylist()) == {None}  # no mesh
