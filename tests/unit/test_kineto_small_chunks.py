"""A small decoded chunk of a Kineto trace is made raw with the next one (``_HOLD_ROWS``): the
trace's events are the same as when every chunk is made raw alone, a small trace is one batch,
and a trace of metadata alone, or of events cut into many tiny chunks, reads as before."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pytest

import traceview.parsers.kineto.parser as kineto
from tests.conftest import SAMPLES
from traceview.parsers import parser_named

TRACES = sorted((SAMPLES / "pytorch").glob("*/rank-0.pt.trace.json.gz"))[:6]


def _parsed(path: Path) -> tuple[list, list[str]]:
    parsed = parser_named("kineto").parse(path)
    return parsed.events.combine_chunks().unify_dictionaries().to_pylist(), parsed.notes.warnings


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name)
def test_holding_small_chunks_changes_no_event(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = _parsed(path)
    monkeypatch.setattr(kineto, "_HOLD_ROWS", 0)
    assert _parsed(path) == held


def _trace(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "rank-0.pt.trace.json.gz"
    document = {"schemaVersion": 1, "traceEvents": events, "traceName": "x"}
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def _event(i: int) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1,
            "ts": 1000.0 + 10 * i, "dur": 5.0}  # fmt: skip


def test_a_small_trace_is_one_batch(tmp_path: Path) -> None:
    path = _trace(tmp_path, [_event(i) for i in range(12)])
    batches = list(parser_named("kineto").stream(path))
    assert [b.num_rows for b in batches] == [12]


def test_many_tiny_chunks_and_metadata_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # past the reader's first block (2 MB read at once), so that it cuts chunks of its own
    path = _trace(tmp_path, [_event(i) for i in range(30_000)])
    whole = _parsed(path)
    small = functools.partial(kineto.ChromeTraceReader, chunk_bytes=64 << 10)
    monkeypatch.setattr(kineto, "ChromeTraceReader", small)
    chunks = list(small(path, kineto._decode_chunk))
    assert sum(c.batch.num_rows < kineto._HOLD_ROWS for c in chunks) > 5  # (held, joined)
    assert _parsed(path) == whole
    monkeypatch.setattr(kineto, "_HOLD_ROWS", 0)
    assert _parsed(path) == whole
    meta = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}
    with pytest.raises(Exception) as error:  # (no events: refused, as before, with one line)
        parser_named("kineto").parse(_trace(tmp_path, [meta] * 3))
    assert "IndexError" not in repr(error.value)
