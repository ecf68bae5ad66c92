"""The run directory caches the analysis, never a reason to re-ingest: tables written by another
analysis version, or missing, are recomputed from the events and equal a fresh ingest's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from traceview.analysis import ANALYSIS_VERSION
from traceview.model import schema as S
from traceview.runs import ingest_run, open_run
from traceview.store import rundir as R

#: Two of the analysis tables a run directory caches (docs/design.md, section 4)
STEPS, OPS = "steps.parquet", "ops.parquet"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingest_run([SAMPLES / "pytorch" / "ddp"], tmp_path_factory.mktemp("rundir") / "run")


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_ingest_stamps_the_analysis_version(fresh: Path) -> None:
    assert R.read_manifest(fresh).analysis_version == ANALYSIS_VERSION


def test_tables_of_another_analysis_version_are_recomputed_and_cached(
    fresh: Path, tmp_path: Path
) -> None:
    run = _copy(fresh, tmp_path)
    manifest = R.read_manifest(run)
    (run / R.MANIFEST).write_text(json.dumps({**manifest.to_builtins(), "analysis_version": "0"}))
    # an older analysis wrote different numbers: they must not be read back
    R.write_parquet(run / STEPS, R.read_table(fresh / STEPS).slice(0, 1))
    with open_run([run]) as opened:
        assert opened.steps.equals(R.read_table(fresh / STEPS))
        assert opened.ops.equals(R.read_table(fresh / OPS))
        assert not opened.temporary
    assert R.read_manifest(run).analysis_version == ANALYSIS_VERSION
    assert R.read_table(run / STEPS).equals(R.read_table(fresh / STEPS)), (
        "the fresh tables are cached"
    )


def test_missing_tables_are_recomputed_from_the_events(fresh: Path, tmp_path: Path) -> None:
    run = _copy(fresh, tmp_path)
    (run / STEPS).unlink()
    (run / OPS).unlink()
    with open_run([run]) as opened:
        report = json.loads(opened.report().to_json())
    with open_run([fresh]) as original:
        expected = json.loads(original.report().to_json())
    assert report["run"].pop("path") == str(run)
    expected["run"].pop("path")
    assert report == expected


def test_recomputing_keeps_the_manifests_other_keys(fresh: Path, tmp_path: Path) -> None:
    run = _copy(fresh, tmp_path)
    raw = json.loads((run / R.MANIFEST).read_text())
    raw.update(analysis_version="0", written_by_a_later_version={"x": 1})
    (run / R.MANIFEST).write_text(json.dumps(raw))
    with open_run([run]):
        pass
    after = json.loads((run / R.MANIFEST).read_text())
    assert after["analysis_version"] == ANALYSIS_VERSION
    assert after["written_by_a_later_version"] == {"x": 1}
    assert {k: v for k, v in after.items() if k != "analysis_version"} == {
        k: v for k, v in raw.items() if k != "analysis_version"
    }


def test_a_newer_analysis_cache_is_not_overwritten(fresh: Path, tmp_path: Path) -> None:
    run = _copy(fresh, tmp_path)
    raw = json.loads((run / R.MANIFEST).read_text())
    (run / R.MANIFEST).write_text(json.dumps({**raw, "analysis_version": "999"}))
    before = (run / STEPS).read_bytes()
    with open_run([run]) as opened:
        assert opened.steps.equals(R.read_table(fresh / STEPS)), "this version's tables, in memory"
    assert (run / STEPS).read_bytes() == before
    assert json.loads((run / R.MANIFEST).read_text())["analysis_version"] == "999"


def test_a_status_with_an_odd_field_keeps_the_rest(tmp_path: Path) -> None:
    """One wrong-typed field in status.json costs that field, with a warning, not the rank's
    clock offset (or its rank)."""
    import gzip

    folder = tmp_path / "traces"
    folder.mkdir()
    source = SAMPLES / "pytorch" / "ddp" / "rank-1.pt.trace.json.gz"
    (folder / "trace.json").write_bytes(gzip.decompress(source.read_bytes()))
    (folder / "status.json").write_text(
        json.dumps({"rank": 1, "notes": None, "clock": {"offset_ns": 5_000_000, "method": "tcp"}})
    )
    run = ingest_run([folder], tmp_path / "run")
    manifest = R.read_manifest(run)
    assert [r.rank for r in manifest.ranks] == [1]
    assert manifest.ranks[0].clock_offset_ns == 5_000_000
    assert any("notes" in w and "status.json" in w for w in manifest.notes.warnings)


def test_collect_record_survives_odd_status_fields() -> None:
    from traceview.model.manifest import collected

    record = collected(
        {"exit_code": 3, "ranks": [{"rank": 0, "state": "ok", "clock": None, "notes": None}]}
    )
    assert record.exit_code == 3 and record.ranks[0].rank == 0 and record.ranks[0].state == "ok"


def test_a_damaged_cache_is_recomputed_not_an_error(fresh: Path, tmp_path: Path) -> None:
    """steps.parquet cut short (a write killed midway) is only a cache: read the events again."""
    run = _copy(fresh, tmp_path)
    (run / STEPS).write_bytes((fresh / STEPS).read_bytes()[:300])
    with open_run([run]) as opened:
        assert opened.steps.equals(R.read_table(fresh / STEPS))
    assert R.read_table(run / STEPS).equals(R.read_table(fresh / STEPS)), "and the cache is mended"


def test_tables_on_disk_are_as_the_readme_says(fresh: Path) -> None:
    """README, "The run directory": the events' string columns are dictionary-encoded, the small
    per-rank tables keep plain strings, and events hold the whole-trace and step spans too."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    (part,) = (fresh / "events").glob("rank=0/*.parquet")
    events = pq.read_schema(part)
    strings = [f for f in events if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
    assert strings and all(pa.types.is_dictionary(f.type) for f in strings)
    for table in (STEPS, OPS, "collectives.parquet"):
        schema = pq.read_schema(fresh / table)
        assert not any(pa.types.is_dictionary(f.type) for f in schema), table
    kinds = (
        pl.scan_parquet(fresh / "events" / "**" / "*.parquet", hive_partitioning=True)
        .group_by("kind")
        .len()
        .collect()
    )
    counts = dict(zip(kinds["kind"].cast(pl.String), kinds["len"], strict=True))
    assert counts["trace"] == 2 and counts["step"] == 10  # 2 ranks, 5 steps each


def test_leftovers_of_a_dotted_host_and_run_name_are_recognised(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster host names hold dots (node1.cluster.local), run names too (run.v2): a previous
    run parked by a killed ingest on such a host is still put back, a dead one's staging folder
    still removed."""
    monkeypatch.setattr(R.socket, "gethostname", lambda: "node1.cluster.local")
    target = tmp_path / "run.v2"
    dead = 2**22 + 12345  # above pid_max's default: no such process
    shutil.copytree(fresh, tmp_path / f".run.v2.old-node1.cluster.local-{dead}")
    (tmp_path / f".run.v2.partial-node1.cluster.local-{dead}").mkdir()
    assert R.parked_hint(target) is not None
    notes = R.Notes()
    R.recover(target, notes)
    assert R.is_run_dir(target) and R.leftovers(target) == []
    assert any("restored the previous run" in w for w in notes.warnings)


def test_a_small_ranks_events_are_plain_pages_whose_damage_is_found(
    fresh: Path, tmp_path: Path
) -> None:
    """A rank of few events is written uncompressed, each page with its checksum: in place (a
    local pool's worker) or beside and renamed, the same file; a run of bytes overwritten
    anywhere in its pages is an error reading it, never other numbers."""
    import pyarrow.parquet as pq

    from traceview.model.errors import BadInput

    events = R.read_events(fresh, [0]).slice(0, 300)
    assert events.num_rows < R.SMALL_EVENTS_ROWS
    run = tmp_path / "run"
    written = R.write_events(run, 0, events)
    beside = written.read_bytes()
    assert R.write_events(run, 0, events, in_place=True).read_bytes() == beside
    meta = pq.ParquetFile(written).metadata
    codecs = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
    assert codecs == {"UNCOMPRESSED"}
    assert R.read_events(run, [0]).equals(events)
    pages_end = (
        min(meta.row_group(0).column(i).data_page_offset for i in range(meta.num_columns))
        + meta.row_group(0).total_byte_size
    )
    undetected = []
    for at in range(4, pages_end - 32, max(1, pages_end // 97)):
        damaged = beside[:at] + bytes(b ^ 0x5A for b in beside[at : at + 32]) + beside[at + 32 :]
        written.write_bytes(damaged)
        try:
            R.read_events(run, [0])
        except BadInput:
            continue
        undetected.append(at)
    assert not undetected
    # a large rank stays compressed
    many = events.take([i % events.num_rows for i in range(R.SMALL_EVENTS_ROWS)])
    big = pq.ParquetFile(R.write_events(tmp_path / "big", 0, many)).metadata
    assert big.row_group(0).column(0).compression == "ZSTD"


def test_identities_see_every_link_out_of_the_run(fresh: Path, tmp_path: Path) -> None:
    """A rank's events file seen by one lstat is what following every link says: a file or a
    rank's folder linked out of the run is "out", one linked inside is the file it names."""
    run = _copy(fresh, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(R.events_path(run, 1), outside / "part-0.parquet")
    slow = R.identities(run)

    def each_followed() -> dict[str, R.Identity]:
        found = {R.MANIFEST: R._identity(run, run / R.MANIFEST)}
        for rank, path in R._rank_parts(run):
            found[f"{R.EVENTS}/rank={rank}/{path.name}"] = R._identity(run, path)
        for name in S.SIDE_INPUTS:
            side = R.side_path(run, name)
            if side.is_symlink() or side.exists():
                found[side.name] = R._identity(run, side)
        return found

    assert slow == each_followed()
    (run / R.EVENTS / "rank=5").mkdir()
    (run / R.EVENTS / "rank=5" / "part-0.parquet").symlink_to(R.events_path(run, 0))
    (run / R.EVENTS / "rank=6").symlink_to(outside)
    (run / R.EVENTS / "rank=7").mkdir()
    (run / R.EVENTS / "rank=7" / "part-0.parquet").symlink_to(outside / "part-0.parquet")
    found = R.identities(run)
    assert found == each_followed()
    assert found["events/rank=6/part-0.parquet"] == "out"
    assert found["events/rank=7/part-0.parquet"] == "out"
    assert found["events/rank=5/part-0.parquet"] == found["events/rank=0/part-0.parquet"]
    # the events folder itself linked out: every rank's file is out
    shutil.move(run / R.EVENTS, tmp_path / "events")
    (run / R.EVENTS).symlink_to(tmp_path / "events")
    found = R.identities(run)
    assert found == each_followed()
    assert {v for k, v in found.items() if k.startswith("events/")} == {"out"}
