"""The streaming Chrome-trace reader: any chunking gives the same events as one json.loads."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

from traceview.model.errors import BadInput
from traceview.parsers.chrome_stream import ChromeTraceReader, read_header


def events_of(path: Path, chunk_bytes: int) -> tuple[list[dict], ChromeTraceReader]:
    reader = ChromeTraceReader(path, msgspec.json.decode, chunk_bytes=chunk_bytes)
    events = [e for chunk in reader for e in chunk]
    return events, reader


TRICKY_NAMES = [
    "aten::mm",
    'a "quoted" }, {"name": "fake"} name',
    "brackets ] [ } { inside",
    "line\nbreak and tab\t and \\ backslash",
    "\x1b]0;pwned\x07 escape",
    "ünïcødé ✓",
]


def kineto_like(n: int) -> dict:
    events = []
    for i in range(n):
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": TRICKY_NAMES[i % len(TRICKY_NAMES)],
                "pid": 1,
                "tid": 2,
                "ts": 1000.5 + i,
                "dur": 0.5,
                "args": {
                    "External id": i,
                    "Input Dims": [[1, 2], []],
                    "nested": [{"a": 1}, {"b": [2]}],
                },
            }
        )
    return {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 3, "world_size": 8},
        "traceEvents": events,
        "deviceProperties": [{"id": 0}, {"id": 1}],
        "traceName": "x",
        "baseTimeNanoseconds": 1700000000000000000,
    }


def write(path: Path, doc: object, indent: int | None = 2) -> bytes:
    data = json.dumps(doc, indent=indent).encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return data


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("chunk_bytes", [64, 333, 4096, 1 << 20])
def test_any_chunk_size_reads_the_same_events(
    tmp_path: Path, indent: int | None, chunk_bytes: int
) -> None:
    doc = kineto_like(200)
    path = tmp_path / "t.json"
    write(path, doc, indent)
    events, reader = events_of(path, chunk_bytes)
    assert events == doc["traceEvents"]
    assert reader.info.header == {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 3, "world_size": 8},
    }
    assert reader.info.trailer["baseTimeNanoseconds"] == doc["baseTimeNanoseconds"]
    assert reader.info.trailer["deviceProperties"] == [{"id": 0}, {"id": 1}]
    assert reader.info.lost_bytes == 0 and reader.info.damage is None


def test_gzip_and_bare_array(tmp_path: Path) -> None:
    doc = kineto_like(50)
    path = tmp_path / "t.json.gz"
    write(path, doc["traceEvents"])
    events, reader = events_of(path, 100)
    assert events == doc["traceEvents"]
    assert reader.info.stream.compressed


def test_header_is_read_without_the_events(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    write(path, kineto_like(10))
    assert read_header(path)["distributedInfo"] == {"rank": 3, "world_size": 8}


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_truncated_trace_keeps_every_complete_event(tmp_path: Path, suffix: str) -> None:
    doc = kineto_like(300)
    full = json.dumps(doc, indent=2).encode()
    for cut in (len(full) // 3, len(full) // 2 + 17, len(full) - 200):
        path = tmp_path / f"cut{cut}{suffix}"
        data = full[:cut]
        path.write_bytes(
            gzip.compress(data)[: len(gzip.compress(data)) - 5] if suffix == ".json.gz" else data
        )
        events, reader = events_of(path, 512)
        assert 0 < len(events) < 300
        assert events == doc["traceEvents"][: len(events)], (
            "kept events must be the prefix, unchanged"
        )
        assert reader.info.damage is not None
        # Everything after the last kept event is reported lost.
        assert reader.info.lost_bytes > 0


def test_malformed_event_in_the_middle_loses_only_that_event(tmp_path: Path) -> None:
    doc = kineto_like(100)
    text = json.dumps(doc, indent=2)
    marker = '"External id": 50,'
    assert marker in text
    broken = text.replace(marker, '"External id": 50 oops,', 1)
    path = tmp_path / "t.json"
    path.write_text(broken)
    events, reader = events_of(path, 256)
    ids = [e["args"]["External id"] for e in events]
    assert 50 not in ids
    assert ids[:50] == list(range(50))
    assert ids[-1] == 99, "events after the damage are still read"
    assert reader.info.damage and "malformed" in reader.info.damage


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"   \n ", "empty"),
        (b"hello world", "not a JSON trace"),
        (b'{"foo": 1, "bar": [1, 2]}', "without a traceEvents array"),
        (b"\x1f\x8b\x08\x00garbage-that-is-not-deflate", "corrupt gzip"),
    ],
)
def test_unreadable_input_is_bad_input(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(BadInput, match=message):
        events_of(path, 1024)


# --- where a decode failed: found in the bytes, not read from a decoder's message --------------


@pytest.mark.parametrize(
    ("text", "kind", "position"),
    [
        (b'[{"a": 1}, {"b": 2}], "x": 1}', "trailing", 20),
        (b'[{"a": 1}]\n  }', "trailing", 13),
        (b'[{"a": 1}, {"b":', "truncated", None),
        (b'[{"a": 1}, {"b": "unterminated', "truncated", None),
        (b'[{"a": 1}, {"b": 2 "c"}, {"d": 3}]', "malformed", 19),
        (b'[{"a": "x\xff\xfey"}, {"b": 2}]', "malformed", 9),
        (b'[{"a": NaN}]', "malformed", 7),
        (b'[{"a": "l\xc3\xa4nge", "b": 2 x}]', "malformed", 24),  # a byte offset, not a character's
        (b'["tab\tinside"]', "malformed", 5),
        # a surrogate escape without its other half: Python reads it, strict decoders do not
        (b'[{"a": "x\\ud800y"}], "k": 1}', "malformed", 9),
        (b'["\\udc00"]', "malformed", 2),
        (b'["\\ud83d\\ude00", "\\\\ud800"]', None, None),  # a pair; an escaped backslash
        (b"[1, 2]  ", None, None),
    ],
)
def test_a_fault_is_placed_by_reading_the_bytes(
    text: bytes, kind: str | None, position: int | None
) -> None:
    from traceview.parsers.json_fault import locate

    fault = locate(text)
    assert (fault.kind, fault.position) == (kind, position) if fault else kind is None


def test_damage_before_invalid_utf8_is_the_first_fault() -> None:
    from traceview.parsers.json_fault import locate

    fault = locate(b'[{"a": 1 2}, {"b": "\xff"}]')
    assert fault is not None and (fault.kind, fault.position) == ("malformed", 9)


@pytest.mark.parametrize("raises", [UnicodeDecodeError, msgspec.DecodeError])
def test_invalid_utf8_loses_one_event_however_the_decoder_reports_it(
    tmp_path: Path, raises: type[Exception]
) -> None:
    """msgspec up to 0.22 raised UnicodeDecodeError for invalid UTF-8 in a string, 0.23 a
    DecodeError with no position: either way one event is lost, found at its byte."""

    def decode(data: object) -> list[dict]:
        raw = bytes(data)  # type: ignore[call-overload]
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if raises is UnicodeDecodeError:
                raise
            raise msgspec.DecodeError("Invalid UTF-8 encoded string") from exc
        return msgspec.json.decode(raw)

    doc = kineto_like(100)
    text = json.dumps(doc, indent=2).encode()
    at = text.index(b'"External id": 50,')
    at = text.rindex(b'"name": "', 0, at) + len(b'"name": "')
    path = tmp_path / "t.json"
    path.write_bytes(text[:at] + b"\xff\xfe" + text[at + 2 :])
    reader = ChromeTraceReader(path, decode, chunk_bytes=512)
    ids = [e["args"]["External id"] for chunk in reader for e in chunk]
    assert ids == [i for i in range(100) if i != 50]
    assert reader.info.damage and "invalid UTF-8" in reader.info.damage
    assert f"near byte {at:,}" in reader.info.damage
