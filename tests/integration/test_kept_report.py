"""A run's finished report kept in its run directory (traceview/runs/finished.py): the next plain
``report`` shows it without opening the run's tables or importing pyarrow, and only where it
is what computing the report again gives; anything changed in the run, another option, a
link, a damaged or odd file in its place, and the report is computed again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from traceview.runs import finished

REPO = Path(__file__).resolve().parents[2]
DDP = REPO / "sample_traces" / "pytorch" / "ddp"
SLOWIO = REPO / "sample_traces" / "pytorch" / "slowio"

#: A plain report of a run, run as the CLI runs it, saying afterwards whether pyarrow was
#: imported (the report itself on stdout, the answer as the last line).
_WITHOUT_ARROW = """
import sys
from traceview.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(code, "pyarrow" in sys.modules)
"""


def _ingested(tmp_path: Path, traces: Path = DDP) -> Path:
    run = tmp_path / "run"
    assert run_cli("ingest", traces, "-o", run).code == 0
    return run


def _computed(run: Path, *options: str) -> str:
    """``report`` of ``run`` computed afresh (no kept report): the reference."""
    (run / finished.REPORT_CACHE).unlink(missing_ok=True)
    out = run_cli("report", *options, run)
    assert out.code == 0, out.err
    (run / finished.REPORT_CACHE).unlink(missing_ok=True)
    return out.out


def _report(run: Path, *options: str) -> tuple[str, bool]:
    """A report of ``run`` and whether it imported pyarrow (False: the kept report answered)."""
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ARROW, "report", *options, str(run)],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"}, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown, _, last = proc.stdout.rstrip("\n").rpartition("\n")
    code, arrow = last.split()
    assert code == "0", proc.stderr
    return shown + "\n", arrow == "True"


@pytest.mark.parametrize("options", [(), ("--json",), ("--all-ranks",)])
def test_ingest_keeps_the_report_the_next_report_shows_without_arrow(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    run = _ingested(tmp_path)
    assert (run / finished.REPORT_CACHE).is_file()
    shown, arrow = _report(run, *options)
    assert not arrow
    expected = _computed(run, *options)
    assert shown == expected
    # a report computed (no kept one) keeps it: the one after shows it, the same
    run_cli("report", *options, run)
    assert _report(run, *options) == (expected, False)


def test_the_path_shown_is_the_one_written(tmp_path: Path) -> None:
    run = _ingested(tmp_path)
    out = run_cli("report", "--json", "run", cwd=tmp_path)
    assert json.loads(out.out)["run"]["path"] == "run"
    assert json.loads(run_cli("report", "--json", run).out)["run"]["path"] == str(run)


def _replace_rank_1(run: Path, tmp_path: Path) -> None:
    """Rank 1's events from another run (the slowio sample's), the manifest left alone."""
    other = _ingested(tmp_path / "other", SLOWIO)
    shutil.rmtree(run / "events" / "rank=1")
    shutil.copytree(other / "events" / "rank=1", run / "events" / "rank=1")


@pytest.mark.parametrize(
    "change",
    [
        "another-runs-rank",
        "touched",
        "record-added",
        "manifest-edited",
        "table-damaged",
        "top",
        "steps",
    ],
)
def test_anything_changed_and_the_report_is_computed_again(tmp_path: Path, change: str) -> None:
    run = _ingested(tmp_path)
    options: tuple[str, ...] = ("--json",)
    if change == "another-runs-rank":
        _replace_rank_1(run, tmp_path)
    elif change == "touched":  # the same bytes, written again
        part = next((run / "events" / "rank=0").iterdir())
        os.utime(part, ns=(part.stat().st_atime_ns, part.stat().st_mtime_ns + 1_000_000))
    elif change == "record-added":  # a step record a job writes
        (run / "raw").mkdir(exist_ok=True)
        (run / "raw" / "steps.rank-0.jsonl").write_text("")
    elif change == "manifest-edited":
        doc = json.loads((run / "manifest.json").read_text())
        doc["notes"]["remarks"] = [*doc["notes"].get("remarks", []), "edited"]
        (run / "manifest.json").write_text(json.dumps(doc))
    elif change == "table-damaged":  # a cached table: computed again from the events
        (run / "ops.parquet").write_bytes(b"PAR1 damaged")
    elif change == "top":
        options = ("--json", "--top", "3")
    elif change == "steps":
        options = ("--json", "--steps", "3-5")
    shown, arrow = _report(run, *options)
    assert arrow, "the kept report answered a run that changed"
    assert shown == _computed(run, *options)


def test_a_link_in_the_run_keeps_no_report(tmp_path: Path) -> None:
    run = _ingested(tmp_path)
    (run / finished.REPORT_CACHE).unlink()
    (run / "notes.txt").symlink_to(tmp_path)
    out = run_cli("report", run)
    assert out.code == 0, out.err
    assert not (run / finished.REPORT_CACHE).exists()
    assert finished.fingerprint(run) is None


@pytest.mark.parametrize("kind", ["garbage", "foreign-key", "fifo", "directory", "link"])
def test_a_damaged_or_odd_kept_report_is_computed_again(tmp_path: Path, kind: str) -> None:
    run = _ingested(tmp_path)
    kept = run / finished.REPORT_CACHE
    expected = _computed(run, "--json")
    if kind == "garbage":
        kept.write_bytes(b"\x00[not json")
    elif kind == "foreign-key":  # a kept report of another run, moved in
        other = _ingested(tmp_path / "other", SLOWIO)
        shutil.copy(other / finished.REPORT_CACHE, kept)
    elif kind == "fifo":
        os.mkfifo(kept)
    elif kind == "directory":
        kept.mkdir()
    elif kind == "link":
        kept.symlink_to(tmp_path / "elsewhere.json")
    out = run_cli("report", "--json", run)
    assert out.code == 0, out.err
    assert out.out == expected
    if kind == "link":
        assert not (tmp_path / "elsewhere.json").exists()  # nothing written through it


def test_a_kept_report_as_written_is_printed_with_its_path_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``report --json`` prints the kept bytes with the run's path replaced, not decoding
    them, where they are the bytes traceview wrote (their CRC kept beside them)."""
    run = _ingested(tmp_path)
    expected = _computed(run, "--json")
    run_cli("report", "--json", run)  # (keeps it again)

    def decoded(*_: object) -> None:
        raise AssertionError("the kept report was decoded")

    monkeypatch.setattr(finished, "_decoded", decoded)
    printed, _ = finished.look_json(run, 10, Path("elsewhere"))
    assert printed is not None
    assert json.loads(printed)["run"]["path"] == "elsewhere"
    assert json.loads(printed) == {**json.loads(expected), "run": json.loads(printed)["run"]}
    printed, _ = finished.look_json(run, 10, run)
    assert printed is not None and printed + "\n" == expected


def test_a_kept_report_edited_or_laid_out_otherwise_is_decoded_whole(tmp_path: Path) -> None:
    """A kept report indented, with its fields in another order, or edited, is not printed as
    it is: decoded whole (the same JSON, still without computing the report), or computed again
    where it is no report."""
    run = _ingested(tmp_path)
    expected = _computed(run, "--json")
    run_cli("report", "--json", run)  # (keeps it again)
    assert _report(run, "--json") == (expected, False)
    key, report, crc = json.loads((run / finished.REPORT_CACHE).read_bytes())
    moved = {"summary": report["summary"], **report}  # "run" no longer first
    spaced = (run / finished.REPORT_CACHE).read_bytes().replace(b',"summary"', b' ,"summary"', 1)
    for layout in (json.dumps([key, report, crc], indent=2), json.dumps([key, moved, crc])):
        (run / finished.REPORT_CACHE).write_text(layout)
        assert _report(run, "--json") == (expected, False)
    (run / finished.REPORT_CACHE).write_bytes(spaced)
    assert _report(run, "--json") == (expected, False)
    # as traceview writes it but for a warning after the run that is no string
    damaged = spaced.replace(b' ,"summary"', b',"summary"').replace(
        b'"warnings":[', b'"warnings":[1,', 1
    )
    assert b'"warnings":[1,' in damaged
    (run / finished.REPORT_CACHE).write_bytes(damaged)
    assert _report(run, "--json") == (expected, True)


def test_a_read_only_run_reports_and_keeps_nothing(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    run = _ingested(tmp_path)
    (run / finished.REPORT_CACHE).unlink()
    run.chmod(0o555)
    try:
        out = run_cli("report", run)
        assert out.code == 0, out.err
        assert not (run / finished.REPORT_CACHE).exists()
    finally:
        run.chmod(0o755)
