"""File and folder names that are not valid UTF-8 (any byte string is a valid name on Linux) are
read like any other: ingested, reported, exported. Where a name must be written as text (the
manifest, ``report --json``, the terminal), each byte that is not UTF-8 is written as ``\\xNN``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli

SAMPLE = SAMPLES / "pytorch" / "ddp"
FOLDER = b"run\xff\xfe"  # neither byte can occur in UTF-8
FILE = b"rank-0.pt\xe9.trace.json.gz"  # a Latin-1 é
SHOWN_FOLDER = "run\\xff\\xfe"
SHOWN_FILE = "rank-0.pt\\xe9.trace.json.gz"


@pytest.fixture
def undecodable(tmp_path: Path) -> Path:
    """The ddp sample in a folder whose name, and one of whose file names, are not UTF-8."""
    folder = os.fsencode(tmp_path) + b"/" + FOLDER
    os.mkdir(folder)
    shutil.copy(SAMPLE / "rank-0.pt.trace.json.gz", folder + b"/" + FILE)
    shutil.copy(SAMPLE / "rank-1.pt.trace.json.gz", folder + b"/rank-1.pt.trace.json.gz")
    return Path(os.fsdecode(folder))


def test_a_folder_and_a_trace_named_in_other_bytes_are_ingested_and_recorded_escaped(
    undecodable: Path, tmp_path: Path
) -> None:
    result = run_cli("ingest", undecodable, "-o", tmp_path / "out")
    assert result.code == 0, result.err
    assert SHOWN_FOLDER in result.out or str(tmp_path / "out") in result.out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_bytes().decode("utf-8"))
    sources = sorted(r["source"] for r in manifest["ranks"])
    assert sources[0].endswith(f"{SHOWN_FOLDER}/{SHOWN_FILE}"), sources
    assert sources[1].endswith(f"{SHOWN_FOLDER}/rank-1.pt.trace.json.gz"), sources
    assert any(SHOWN_FOLDER in i for i in manifest["inputs"]), manifest["inputs"]
    # the run reads back as the same two ranks
    report = run_cli("report", "--json", tmp_path / "out")
    assert report.code == 0, report.err
    assert [r["rank"] for r in report.json()["ranks"]] == [0, 1]


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_a_damaged_trace_named_in_other_bytes_is_named_escaped(
    undecodable: Path, json_out: bool
) -> None:
    damaged = os.fsencode(undecodable) + b"/rank-2\xfa.pt.trace.json"
    with open(damaged, "wb") as fh:
        fh.write(b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "na')
    result = run_cli(
        "report", undecodable, *(["--json"] if json_out else []), env={"COLUMNS": "1000"}
    )
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    output = (result.out + result.err).splitlines()
    warnings = result.json()["warnings"] if json_out else output
    named = [w for w in warnings if f"{SHOWN_FOLDER}/rank-2\\xfa.pt.trace.json" in w]
    assert named and all("left out" in w or "no complete event" in w for w in named), warnings


@pytest.mark.parametrize("fmt", ["parquet", "chrome"])
def test_a_run_from_names_in_other_bytes_exports(
    undecodable: Path, tmp_path: Path, fmt: str
) -> None:
    run = tmp_path / "out"
    assert run_cli("ingest", undecodable, "-o", run).code == 0
    target = tmp_path / ("export" if fmt == "parquet" else "trace.json")
    result = run_cli("export", "--format", fmt, run, "-o", target)
    assert result.code == 0, result.err
    if fmt == "chrome":
        assert json.loads(target.read_bytes())["traceEvents"]
    else:
        assert any(target.glob("*.parquet"))
