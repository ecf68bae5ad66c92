"""An XSpace's lines and events read at the wire level (parsers/xspace_lines.py), and
TensorFlow's memory records read with it (``tensorflow._memory_read``), against the same bytes
decoded by the protobuf classes (the minimal schema's ``XSpaceEvents``): the same rows, host
starts and dropped records, in the same order; odd layouts protobuf reads (fields out of order
or given twice, unknown fields) read the same; what is not that layout goes to the classes."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_wave4 import T0, _memory_records, _pb_bytes, _pb_int, _pb_str, xspace
from traceview.parsers import tensorflow as T
from traceview.parsers import xspace_lines as L
from traceview.parsers.xspace_hlo import space_with_events

pytest.importorskip("google.protobuf", reason="the protobuf classes are the reference")


def _by_classes(path: Path) -> Any:
    """``_memory_read``'s result as the protobuf classes read the file (each line's events
    decoded as objects), the reference."""
    space = space_with_events(path)
    assert space is not None
    return T._memory_read_by_classes(space)


def _same(path: Path) -> Any:
    wire = T._memory_read_at_the_wire_level(path.read_bytes())
    classes = _by_classes(path)
    assert wire.rows == classes.rows
    assert list(wire.host_starts.items()) == list(classes.host_starts.items())
    assert wire.bad == classes.bad
    return wire


_HOST = {
    "python3": [("train", s * 10_000.0, 9000.0, {"step_num": s}) for s in range(4)],
    "tf_Compute": [
        (n, s * 10_000.0 + k, 3.0, {})
        for s in range(4)
        for k, n in enumerate(["MatMul", "Relu", "MatMul", "Add"])
    ],
}


@pytest.mark.parametrize(
    "start_ns", [T0, 2**63 - 1000, -(2**62)], ids=["plain", "edge", "negative"]
)
def test_memory_records_read_as_the_classes_read_them(start_ns: int, tmp_path: Path) -> None:
    """Records good and hostile (totals negative, huge, not numbers, missing; odd allocator
    names), host lines of several names, a device plane, starts at int64's edges."""
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(
        xspace(
            {
                "/host:CPU": {**_HOST, "allocator": _memory_records()},
                "/device:GPU:0": {"Stream #1": [("kernel", 5.0, 1.0, {})]},
            },
            start_ns=start_ns,
        )
    )
    read = _same(path)
    assert len(read.rows) > 500 and read.bad > 500 and set(read.host_starts) >= {"MatMul", "train"}


def test_the_sample_profiles_memory_records_read_as_the_classes_read_them() -> None:
    from tests.conftest import SAMPLES

    read = _same(SAMPLES / "tensorflow" / "memory" / "rank-0.xplane.pb")
    assert read.rows and read.host_starts


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return bytes([number << 3 | wire]) + payload


def test_odd_layouts_read_as_the_classes_read_them(tmp_path: Path) -> None:
    """Fields out of order, an event's offset given twice (its last), a line's time given
    twice (and then with other wire types, which protobuf skips, as a varint where the events
    are), unknown fields of every wire type in the plane, a line and an event, a plane's name
    given twice, an event with no fields."""
    unknown = (
        _pb_int(13, 7) + _field(14, 1, struct.pack("<d", 1.5)) + _field(15, 5, b"\x01\x02\x03\x04")
        + _pb_str(12, "x")
    )  # fmt: skip
    stats = _pb_bytes(4, _pb_int(1, 1) + _pb_int(4, 4096)) + _pb_bytes(
        4, _pb_int(1, 2) + _pb_str(5, "GPU_0_bfc")
    )
    alloc = _pb_int(2, 5_000) + _pb_int(1, 1) + unknown + _pb_int(2, 9_000) + stats
    plain = _pb_int(1, 2) + _pb_int(2, 1_000_000)
    line = (
        _pb_bytes(4, plain) + _pb_int(3, 1_000) + unknown + _pb_bytes(4, alloc)
        + _pb_bytes(4, b"") + _pb_int(3, 2_000) + _pb_str(2, "allocator")
        + _pb_bytes(3, b"12") + _pb_int(4, 5) + _field(3, 1, struct.pack("<q", 7))
    )  # fmt: skip
    metadata = b"".join(
        _pb_bytes(4, _pb_int(1, k) + _pb_bytes(2, _pb_int(1, k) + _pb_str(2, name)))
        for k, name in ((1, "MemoryAllocation"), (2, "MatMul"))
    )
    stat_metadata = b"".join(
        _pb_bytes(5, _pb_int(1, k) + _pb_bytes(2, _pb_int(1, k) + _pb_str(2, name)))
        for k, name in ((1, "bytes_allocated"), (2, "allocator_name"))
    )
    plane = (
        _pb_str(2, "/host:first") + _pb_bytes(3, line) + unknown + metadata + _pb_int(1, 3)
        + stat_metadata + _pb_str(2, "/host:CPU") + _pb_bytes(3, line)
    )  # fmt: skip
    path = tmp_path / "odd.xplane.pb"
    path.write_bytes(_pb_bytes(1, plane) + _pb_str(4, "a host"))
    read = _same(path)
    assert [r[1] for r in read.rows] == [2_000 + 9, 2_000 + 9]  # (the last time, the last offset)
    assert read.host_starts["MatMul"] == [3_000, 3_000]


@pytest.mark.parametrize(
    "raw",
    [
        _pb_int(1, 5),  # (a top-level varint)
        _pb_bytes(
            1, _pb_str(2, "/host:CPU") + _pb_bytes(3, _pb_bytes(4, b"\x0b\x0c"))
        ),  # (a group)
        _pb_bytes(1, _pb_str(2, "/host:CPU"))[:-3],  # (cut short)
    ],
    ids=["top-level-varint", "group", "cut-short"],
)
def test_what_is_not_the_layout_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):  # (NotTheLayout, or the walk's own)
        list(L.planes(raw))


def test_a_refused_layout_is_read_by_the_classes(tmp_path: Path, monkeypatch: Any) -> None:
    """Where the wire-level reader refuses the file, ``_memory_read`` gives the classes'."""
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(xspace({"/host:CPU": {**_HOST, "allocator": _memory_records()[:50]}}))

    def refuse(raw: bytes) -> Any:
        raise L.NotTheLayout("refused")

    monkeypatch.setattr(T, "_memory_read_at_the_wire_level", refuse)
    read = T._memory_read(path)
    assert read is not None and read.rows == _by_classes(path).rows and read.rows
