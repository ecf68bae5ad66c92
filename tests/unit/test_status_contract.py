"""The rank's status.json has one writer (collectors/rankside.py, standard library only: it runs
inside the user's job) and one reader (traceview.model.manifest.RankStatus). They cannot share a
class, so this holds their field lists equal, and a status the writer writes reads back whole."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec

from traceview.collectors import rankside
from traceview.model.manifest import Clock, RankStatus


def test_writer_and_reader_have_the_same_fields() -> None:
    written = [f.name for f in dataclasses.fields(rankside.Status)]
    assert written == list(RankStatus.__struct_fields__)
    assert [f.name for f in dataclasses.fields(rankside.ClockOffset)] == list(
        Clock.__struct_fields__
    )


def test_a_written_status_reads_back_every_field(tmp_path: Path) -> None:
    status = rankside.Status(rank=3, world_size=8, local_rank=1, rank_source="env")
    status.clock = dataclasses.asdict(rankside.ClockOffset(offset_ns=-5, uncertainty_ns=7))
    status.state, status.detail, status.profiled_steps = "ok", "done", 5
    status.write(tmp_path)
    data = (rankside.rank_dir(tmp_path, 3) / "status.json").read_bytes()
    read = msgspec.json.decode(data, type=RankStatus, strict=True)  # no field dropped or coerced
    assert msgspec.to_builtins(read) == json.loads(data)
    assert (read.rank, read.world_size, read.clock.offset_ns, read.profiled_steps) == (3, 8, -5, 5)
