"""xprof's ``Trace`` protobuf read at the wire level (parsers/xprof_trace.py), against the same
bytes read by the protobuf classes (upb) event by event (``xplane_batches._event_frames``): the
same columns, on bytes laid out as protobuf allows and xprof does not always write (fields out
of order or given twice, unknown fields of every wire type, arg entries without a key or a
value), and a refusal (``NotTheLayout``) where the bytes are not that layout.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

pytest.importorskip("xprof", reason="the protobuf classes the reader is checked against")

from traceview.parsers import xplane_batches as XB
from traceview.parsers import xprof_trace as X


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    tag = _varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(payload, int)
        return tag + _varint(payload)
    assert isinstance(payload, bytes)
    return tag + (_varint(len(payload)) + payload if wire == 2 else payload)


def _text(number: int, text: str) -> bytes:
    return _field(number, 2, text.encode())


def _entry(key: str | None, value: str | None, reverse: bool = False) -> bytes:
    parts = [
        _text(1, key) if key is not None else b"",
        _text(2, value) if value is not None else b"",
    ]
    return _field(11, 2, b"".join(reversed(parts) if reverse else parts))


def _device(did: int, name: str, resources: dict[int, str]) -> bytes:
    body = _text(1, name) + _field(2, 0, did)
    for rid, rname in resources.items():
        resource = _text(1, rname) + _field(2, 0, rid)
        body += _field(3, 2, _field(1, 0, rid) + _field(2, 2, resource))
    return _field(1, 2, _field(1, 0, did) + _field(2, 2, body))


def _event(*fields: bytes) -> bytes:
    return _field(4, 2, b"".join(fields))


def _odd_trace() -> bytes:
    wide = 2**64 - 1
    return b"".join(
        [
            _device(1, "/host:CPU", {5: "python", 6: ""}),
            _event(_field(1, 0, 1), _field(2, 0, 5), _text(3, "train"), _field(9, 0, 1000),
                   _field(10, 0, 9000), _entry("step_num", "3"), _entry("note", "x")),
            # fields out of order; the name given twice (the last kept); a long name
            _event(_field(10, 0, 7), _text(3, "first"), _field(9, 0, wide), _field(1, 0, 1),
                   _text(3, "é" * 200), _field(2, 0, 6)),
            # unknown fields of every wire type, a key given twice (its last value), an entry's
            # value before its key, entries without a key or a value
            _event(_field(5, 0, 12), _field(6, 1, struct.pack("<d", 1.5)),
                   _field(7, 5, b"\x01\x02\x03\x04"), _text(8, "unknown"), _field(1, 0, 1),
                   _entry("long_name", "a/b:C"), _entry("long_name", "a/b:D"),
                   _entry("group_id", "4", reverse=True), _entry(None, "keyless"),
                   _entry("run_id", None), _field(15, 0, 3)),
            # every field absent (device 0, no name, no times), and a device after the events
            _event(),
            _device(2, "/device:GPU:0", {1: "Stream #1"}),
            _event(_field(1, 0, 2), _field(2, 0, 1), _text(3, "kernel"), _field(9, 0, 500),
                   _field(10, 0, 10), _entry("correlation_id", "77"), _entry("", "empty key")),
        ]
    )  # fmt: skip


def _by_upb(raw: bytes) -> tuple[Any, Any]:
    from xprof.protobuf import trace_events_old_pb2

    trace = trace_events_old_pb2.Trace.FromString(raw)
    events = trace.trace_events
    doc = b"".join(XB._frame(XB._devices(trace))) + XB._event_frames(events, 0, len(events))
    return XB.columns(doc)


def _sorted(table: Any) -> Any:
    return table.select(sorted(table.column_names))


def test_odd_layouts_read_as_the_protobuf_classes_read_them() -> None:
    raw = _odd_trace()
    devices, events = X.read(raw, XB.ARGS, XB.ARG)
    meta, expected = _by_upb(raw)
    assert _sorted(events).equals(_sorted(expected))
    assert XB.columns(b"".join(XB._frame(XB._devices(_trace_of(devices)))))[0].equals(meta)
    assert events.column("name").to_pylist()[1] == "é" * 200
    assert events.column(XB.ARG + "long_name").to_pylist()[2] == "a/b:D"
    assert events.column(XB.ARG + "run_id").to_pylist()[2] == ""
    # the whole conversion reads them so too
    meta_whole, events_whole = XB.columns(XB._trace_columns((raw, True)))
    assert meta_whole.equals(meta) and _sorted(events_whole).equals(_sorted(expected))


def _trace_of(raw: bytes) -> Any:
    from xprof.protobuf import trace_events_old_pb2

    return trace_events_old_pb2.Trace.FromString(raw)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(_event(_field(3, 3, b"")), id="a group"),
        pytest.param(_field(4, 0, 5), id="events as a varint"),
        pytest.param(_event(_text(3, "train"))[:-2], id="cut short"),
        pytest.param(_event(_field(9, 0, 1))[:-1], id="cut in a varint"),
        pytest.param(_event(_field(3, 2, b"\xff\xfe")), id="a name that is no UTF-8"),
        pytest.param(
            _field(4, 2, _varint(3 << 3 | 2) + _varint(100) + b"ab"), id="a name past its event"
        ),
    ],
)
def test_what_is_not_the_layout_is_refused(raw: bytes) -> None:
    with pytest.raises(X.NotTheLayout):
        X.read(raw, XB.ARGS, XB.ARG)


def test_a_layout_the_reader_refuses_is_read_by_the_protobuf_classes() -> None:
    """A group inside an event (a wire type protobuf still reads): the conversion falls back to
    the protobuf classes and gives the same events."""
    group = _field(12, 3, b"") + _varint(12 << 3 | 4)  # (an empty group: start, end)
    raw = _event(_field(1, 0, 1), _text(3, "train"), group, _field(9, 0, 5), _field(10, 0, 9))
    with pytest.raises(X.NotTheLayout):
        X.read(raw, XB.ARGS, XB.ARG)
    _, events = XB.columns(XB._trace_columns((raw, True)))
    assert events.to_pylist() == [{"name": "train", "pid": 1, "tid": 0, "ts_ps": 5, "dur_ps": 9}]


def test_real_profiles_read_as_the_protobuf_classes_read_them() -> None:
    from xprof.convert import raw_to_tool_data as tools

    from tests.conftest import SAMPLES

    for path in sorted((SAMPLES / "tensorflow").glob("*/rank-0.xplane.pb")):
        raw, ok = tools._pywrap_profiler_plugin.xspace_to_tools_data([str(path)], *XB._TRACE)
        assert ok
        devices, events = X.read(raw, XB.ARGS, XB.ARG)
        _, expected = _by_upb(raw)
        assert events.num_rows > 1000
        assert _sorted(events).equals(_sorted(expected)), path
        assert _trace_of(devices).devices == _trace_of(raw).devices


@pytest.mark.parametrize("block", [1, 3, 7, 1 << 22])
def test_strings_are_gathered_whole_across_blocks(block: int, monkeypatch: Any) -> None:
    import numpy as np

    monkeypatch.setattr(X, "_GATHER_BYTES", block)
    raw = "..abc.de..fghijkl.é.mn".encode()
    spans = [(0, 0), (2, 5), (5, 5), (6, 8), (10, 17), (18, 20), (1, 1), (20, 22), (2, 4)]
    starts, ends = (np.asarray(x, np.int64) for x in zip(*spans, strict=True))
    got = X._strings(np.frombuffer(raw, np.uint8), starts, ends).to_pylist()
    assert got == [raw[a:b].decode() for a, b in spans]
    assert X._strings(np.frombuffer(raw, np.uint8), starts[:0], ends[:0]).to_pylist() == []


@pytest.mark.parametrize("block", [X.BLOCK_EVENTS, 7, 1000], ids=["block", "blocks-of-7", "1000"])
@pytest.mark.parametrize("seed", range(6))
def test_random_traces_read_as_the_protobuf_classes_read_them(
    seed: int, block: int, monkeypatch: Any
) -> None:
    """Traces the protobuf classes write (every field present or absent, ids and times up to
    2**64 - 1, names of any length and script, arg keys wanted or not), read both ways; read a
    few events at a time, the same columns, in the same order (an arg some block lacks: null
    there)."""
    import random

    monkeypatch.setattr(X, "BLOCK_EVENTS", block)
    from xprof.protobuf import trace_events_old_pb2

    rng = random.Random(seed)
    trace = trace_events_old_pb2.Trace()
    for did in rng.sample(range(1, 2000), 5):
        device = trace.devices[did]
        device.name, device.device_id = rng.choice(["", "/host:CPU", f"/device:GPU:{did}"]), did
        for rid in {rng.randrange(2**64) for _ in range(3)}:
            device.resources[rid].name = rng.choice(["", "python", "Stream #1"])
    words = ["", "a", "train", "é" * 70, "日本" * 40, "x" * 300, "MemcpyH2D"]
    keys = [*sorted(XB.ARGS), "note", "", "long_name "]
    for _ in range(rng.randrange(0, 3000)):
        event = trace.trace_events.add()
        for field, top in (("device_id", 2**64), ("resource_id", 2**64), ("timestamp_ps", 2**64),
                           ("duration_ps", 2**64)):  # fmt: skip
            if rng.random() < 0.8:
                setattr(event, field, rng.randrange(0, rng.choice([2, 200, 2**40, top])))
        if rng.random() < 0.9:
            event.name = rng.choice(words)
        for _ in range(rng.randrange(0, 6)):
            event.args[rng.choice(keys)] = rng.choice(words)
    raw = trace.SerializeToString()
    devices, events = X.read(raw, XB.ARGS, XB.ARG)
    _, expected = _by_upb(raw)
    assert _sorted(events).equals(_sorted(expected))
    assert _trace_of(devices).devices == trace.devices
    monkeypatch.setattr(X, "BLOCK_EVENTS", 1 << 40)
    assert events.equals(X.read(raw, XB.ARGS, XB.ARG)[1])  # (as one block: order too)


def test_the_fallback_reads_many_events_in_batches_on_two_processes(monkeypatch: Any) -> None:
    """Where the wire-level reader refuses the bytes, the protobuf classes read the events a
    batch at a time, half of them in a second process: the same columns, in order."""
    from xprof.protobuf import trace_events_old_pb2

    trace = trace_events_old_pb2.Trace()
    trace.devices[1].name = "/host:CPU"
    for k in range(50):
        event = trace.trace_events.add()
        event.device_id, event.resource_id, event.name = 1, 2, f"op{k}"
        event.timestamp_ps, event.duration_ps = 1000 * k, 500
        if k % 3:
            event.args["long_name"] = f"m/op{k}:Op"
    raw = trace.SerializeToString()
    _, expected = X.read(raw, XB.ARGS, XB.ARG)

    def refuse(*_: Any) -> Any:
        raise X.NotTheLayout("refused")

    monkeypatch.setattr(X, "read", refuse)
    monkeypatch.setattr(XB, "_BATCH_EVENTS", 4)  # (13 batches; 2 x 4 events and more: halves)
    _, events = XB.columns(XB._trace_columns((raw, True)))
    assert _sorted(events).equals(_sorted(expected))
