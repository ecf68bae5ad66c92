"""Names as a hostile or careless file system gives them, for the folder and for a trace file:
bytes that are not UTF-8 (a lone continuation byte, a cut sequence, an encoded surrogate, an
overlong form, Latin-1), and valid names a terminal would act on (an escape sequence, a bidi
override). Every command that reads them ends in exit 0; what it prints (text, ``--json``) is
valid UTF-8 with no control or bidi character; the manifest records each name with its bytes
that are not UTF-8 as ``\\xNN``. ``python -m pytest -m fuzz tests/fuzz/test_undecodable_names.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES

SAMPLE = SAMPLES / "pytorch" / "ddp"

NAMES: dict[str, bytes] = {
    "continuation byte": b"run\x80",
    "cut sequence": b"run\xc3",
    "encoded surrogate": b"run\xed\xa0\x80",
    "overlong slash": b"run\xc0\xaf",
    "latin-1": b"caf\xe9",
    "0xff 0xfe": b"\xff\xfe",
    "escape sequence": b"run\x1b[31mred",
    "bidi override": "run\u202egnp.exe".encode(),
}


def _recorded(name: bytes) -> str:
    """How a name must be recorded: its UTF-8 as it is, each other byte as \\xNN."""
    return name.decode("utf-8", "backslashreplace")


def _run(*args: str | bytes | Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "traceview", *map(os.fsencode, args)],
        capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip


def _clean_text(data: bytes) -> str:
    text = data.decode("utf-8")  # valid UTF-8, or this raises
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in text), text
    assert "\u202e" not in text
    return text


@pytest.fixture(params=sorted(NAMES))
def named(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[bytes, bytes, Path]:
    """The ddp sample in a folder named so, one of its traces named so too."""
    name = NAMES[request.param]
    folder = os.fsencode(tmp_path) + b"/" + name
    os.mkdir(folder)
    trace = b"rank-0-" + name + b".pt.trace.json.gz"
    shutil.copy(SAMPLE / "rank-0.pt.trace.json.gz", folder + b"/" + trace)
    shutil.copy(SAMPLE / "rank-1.pt.trace.json.gz", folder + b"/rank-1.pt.trace.json.gz")
    return name, trace, Path(os.fsdecode(folder))


def test_every_command_reads_such_names_and_writes_them_escaped(
    named: tuple[bytes, bytes, Path], tmp_path: Path
) -> None:
    name, trace, folder = named
    text = _run("report", folder)
    assert text.returncode == 0, text.stderr
    _clean_text(text.stdout + text.stderr)
    as_json = _run("report", folder, "--json")
    assert as_json.returncode == 0, as_json.stderr
    json.loads(_clean_text(as_json.stdout))
    run = tmp_path / "out"
    ingest = _run("ingest", folder, "-o", run)
    assert ingest.returncode == 0, ingest.stderr
    _clean_text(ingest.stdout + ingest.stderr)
    # the manifest is data, not a screen: valid UTF-8 (other bytes as \xNN), names as they are
    manifest = json.loads((run / "manifest.json").read_bytes().decode("utf-8"))
    sources = [r["source"] for r in manifest["ranks"]]
    recorded = f"{_recorded(name)}/{_recorded(trace)}"
    assert any(s.endswith(recorded) for s in sources), (sources, recorded)
    for args in (
        ["report", run, "--json"],
        ["export", run, "--format", "chrome", "-o", tmp_path / "t.json"],
    ):
        result = _run(*args)
        assert result.returncode == 0, result.stderr
        _clean_text(result.stdout + result.stderr)
