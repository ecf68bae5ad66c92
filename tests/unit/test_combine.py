"""A run is the combination of its ranks' parts, wherever each was computed: the parts of
ingest_rank, one rank at a time and in any order, combine into exactly what a whole ingest
writes (the unit of work the scale-out issue distributes)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, for_unit
from traceview.analysis import RANK_TABLES, rank_tables
from traceview.ingest.discover import assign_ranks, discover
from traceview.ingest.rank import ingest_rank
from traceview.ingest.run import combine
from traceview.model.errors import BadInput, Notes
from traceview.runs import ingest_run
from traceview.store import rundir as R


def _parts_combine_into_the_whole_run(sample: str, tmp_path: Path) -> None:
    whole = ingest_run([SAMPLES / sample], tmp_path / "whole")
    notes = Notes()
    traces = discover([SAMPLES / sample], notes)
    assign_ranks(traces, notes)
    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    run_id = uuid.uuid4().hex[:12]
    parts = [ingest_rank(t, parts_dir, run_id, None, rank_tables) for t in traces]
    combined = combine(reversed(parts))  # as a pool returns them: in any order
    assert [r.rank for r in combined.ranks] == sorted(t.rank for t in traces)
    for name in RANK_TABLES:
        assert combined.table(name).equals(R.read_table(whole / f"{name}.parquet")), name
    manifest = R.read_manifest(whole)
    assert [r.events for r in combined.ranks] == [r.events for r in manifest.ranks]


@pytest.mark.parametrize(
    "sample",
    for_unit(["pytorch/ddp", "mxnet/dist_sync", "tensorflow/mwms"], lambda s: (SAMPLES / s,)),
)
def test_parts_combine_into_the_whole_run(sample: str, tmp_path: Path) -> None:
    _parts_combine_into_the_whole_run(sample, tmp_path)


def test_a_rank_twice_is_refused(tmp_path: Path) -> None:
    notes = Notes()
    traces = discover([SAMPLES / "pytorch" / "ddp"], notes)
    assign_ranks(traces, notes)
    part = ingest_rank(traces[0], tmp_path, "x", None, rank_tables)
    with pytest.raises(BadInput, match="came twice"):
        combine([part, part])


def test_the_ranks_notes_are_said_once_each_with_the_ranks_they_came_from() -> None:
    """A note every rank gave is said once, as it is; one some ranks gave names them; many
    parts folded (more than FOLD_PARTS) keep every rank's note and its rank."""
    import pyarrow as pa

    from traceview.ingest.rank import RankPartial
    from traceview.ingest.run import FOLD_PARTS
    from traceview.model.manifest import RankIngest

    def part(rank: int, remarks: list[str], warnings: list[str] = []) -> RankPartial:  # noqa: B006
        table = pa.table({"rank": pa.array([rank], pa.int32()), "x": [rank]})
        return RankPartial(RankIngest(rank=rank), {"t": table}, Notes(list(warnings), remarks))

    ranks = FOLD_PARTS + 6
    parts = [part(r, ["no step markers"]) for r in range(ranks)]
    parts[3] = part(3, ["no step markers", "64 of 326 device activities have no launching call"])
    parts[5] = part(5, ["no step markers", "60 of 320 device activities have no launching call"])
    parts[7] = part(7, ["no step markers"], ["truncated"])
    parts[8] = part(8, ["no step markers"], ["truncated"])
    parts[9] = part(9, ["no step markers"], ["truncated"])
    combined = combine(reversed(parts))
    assert combined.notes.remarks == [
        "no step markers",
        "rank 3: 64 of 326 device activities have no launching call",
        "rank 5: 60 of 320 device activities have no launching call",
    ]
    assert combined.notes.warnings == ["ranks 7-9: truncated"]
    assert combined.table("t").column("x").to_pylist() == list(range(ranks))  # in rank order


def test_a_table_some_ranks_spilled_is_written_in_rank_order_as_if_held_whole(
    tmp_path: Path,
) -> None:
    """Ranks whose segments were spilled to a file as they were made (a rank read in chunks)
    and ranks that hold theirs (read whole), coming in any order and folded past FOLD_PARTS:
    the run's table is every rank's rows in rank order, and the Parquet file written from the
    parts a row group at a time is byte for byte the one written from the table whole."""
    import numpy as np
    import pyarrow as pa

    from traceview.ingest.rank import RankPartial
    from traceview.ingest.run import FOLD_PARTS
    from traceview.model import schema as S
    from traceview.model.columns import TableSpill
    from traceview.model.manifest import RankIngest

    rng = np.random.default_rng(7)

    def segments(rank: int, rows: int) -> pa.Table:
        return pa.table(
            {
                S.RANK: pa.array([rank] * rows, pa.int32()),
                S.STEP: pa.array(rng.integers(0, 4, rows)),
                S.START_NS: pa.array(np.arange(rows) * 10 + rank),
                S.END_NS: pa.array(np.arange(rows) * 10 + rank + 5),
                S.PHASE: pa.array(rng.choice(["forward", "backward"], rows)),
                S.KIND: pa.array(["compute"] * rows),
                S.OP: pa.array(rng.choice(np.array(["aten::mm", "aten::add", None], object), rows)),
            },
            schema=S.SEGMENTS_SCHEMA,
        )

    ranks = FOLD_PARTS + 4
    whole = {r: segments(r, int(rng.integers(0, 3000 if r % 50 else 70_000))) for r in range(ranks)}
    parts = []
    for rank, table in whole.items():
        value: pa.Table | object = table
        if rank % 3 == 0:  # spilled, in pieces as windows end
            spill = TableSpill(tmp_path / f"segments-{rank}.arrows", S.SEGMENTS_SCHEMA)
            for piece in table.to_batches(max_chunksize=997):
                spill.add(pa.Table.from_batches([piece]))
            value = spill.close()
        parts.append(RankPartial(RankIngest(rank=rank), {"segments": value}, Notes()))
    rng.shuffle(parts)
    combined = combine(parts)
    expected = pa.concat_tables([whole[r] for r in range(ranks)])
    assert isinstance(combined.tables["segments"], list)  # (kept as parts: written in pieces)
    assert combined.table("segments").equals(expected)
    R.write_parquet(tmp_path / "whole.parquet", expected)
    R.write_parquet_parts(tmp_path / "parts.parquet", combined.tables["segments"], expected.schema)
    assert (tmp_path / "parts.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
