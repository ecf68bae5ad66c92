"""Kineto's records decoded: one msgspec class per record type (``ph``), the few ``args`` the
core needs, and their values made to fit (ids and sizes as integers, labels as stable ids).

Current Kineto writes categories cpu_op, user_annotation, python_function, cuda_runtime, kernel,
gpu_memcpy, gpu_memset, gpu_user_annotation and ac2g flows; the 2021 format writes Operator,
Runtime, Kernel, Memcpy, Memset and ``async`` flows. ROCm traces use the same categories with
hip* names. Device activities carry the ``correlation`` id of the runtime call that launched
them, which is all the core needs to link the two, so flow events are counted, not kept.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Union

import msgspec

from traceview.parsers import int64_id

#: An ``args`` value not written (an empty Raw: false).
_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The few ``args`` the core needs; everything else in ``args`` is skipped while decoding."""

    external_id: int | str | None = msgspec.field(default=None, name="External id")
    external_id_old: int | str | None = msgspec.field(default=None, name="external id")
    correlation: int | str | None = None
    nbytes: int | float | str | None = msgspec.field(default=None, name="bytes")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    group: str | None = msgspec.field(default=None, name="Process Group Name")
    in_nelems: int | str | None = msgspec.field(default=None, name="In msg nelems")
    in_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In split size")
    out_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Out split size")
    dtype: str | None = None
    # (a plain Raw: msgspec decodes ``Raw | None`` as null only, failing every recorded shape)
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    meta_name: str | None = msgspec.field(default=None, name="name")
    # [memory] records (profile_memory=True): the allocator's totals after the record
    total_allocated: int | float | str | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | float | str | None = msgspec.field(default=None, name="Total Reserved")
    mem_bytes: int | float | str | None = msgspec.field(default=None, name="Bytes")
    device_type: int | str | None = msgspec.field(default=None, name="Device Type")
    device_id: int | str | None = msgspec.field(default=None, name="Device Id")
    # a kernel's launch configuration, kept as the trace writes it ("[80, 1, 1]")
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW


_NO_ARGS = _Args()


class _Complete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A timed event; the record type ("ph") selects the class while decoding."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args = _NO_ARGS


class _Instant(_Complete, tag="i"):
    pass


class _GlobalInstant(_Complete, tag="I"):
    pass


class _Meta(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args = _NO_ARGS


class _Skipped(msgspec.Struct, tag_field="ph", gc=False):
    """Records traceview counts but does not keep (flows, counters...): decoded without fields."""


# Every other record type of the Chrome trace format, skipped without reading its fields.
_SKIPPED_TAGS = ("s", "t", "f", "B", "E", "C", "b", "e", "n", "P", "O", "N", "D", "R", "(", ")",
                 "S", "T", "p", "F", "c", "v", "V")  # fmt: skip
_SKIPPED = tuple(type(f"_Skipped{ord(t)}", (_Skipped,), {}, tag=t) for t in _SKIPPED_TAGS)
_TAG_OF: dict[type, str] = {
    _Complete: "X", _Instant: "i", _GlobalInstant: "I", _Meta: "M",
    **dict(zip(_SKIPPED, _SKIPPED_TAGS, strict=True)),
}  # fmt: skip
_CLASS_OF = {tag: cls for cls, tag in _TAG_OF.items()}
_TIMED = frozenset((_Complete, _Instant, _GlobalInstant))
_INSTANTS = frozenset((_Instant, _GlobalInstant))
_RECORD_TYPES: tuple[type, ...] = (_Complete, _Instant, _GlobalInstant, _Meta, *_SKIPPED)
_DECODER = msgspec.json.Decoder(list[Union[_RECORD_TYPES]])  # type: ignore[valid-type]  # noqa: UP007


def _as_int(value: Any) -> int | None:
    """Ids and counts as integers, whatever the trace wrote ("7", 7.0, "stream 7", "0x1f")."""
    if value is None or value.__class__ is int:
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("stream "):
            text = text[7:]
        try:
            return int(text, 0) if text.startswith(("0x", "0X")) else int(text)
        except ValueError:
            return None
    return None


def _fits_int64(number: int) -> bool:
    return -(1 << 63) <= number < 1 << 63


def _size(value: Any) -> int | None:
    """A size or count as int64; one wider than 64 bits is not a real size (None)."""
    number = _as_int(value)
    return number if number is None or _fits_int64(number) else None


def _id(value: Any) -> int | None:
    """A correlation or external id as int64; a wider one is folded as pid/tid are, the same
    way on both ends of a link, so the link survives."""
    number = _as_int(value)
    return number if number is None or _fits_int64(number) else _thread_id(number)


def _thread_id(value: Any) -> int:
    """pid/tid as int64: numbers as they are, labels ("Spans", "") as stable negative ids."""
    number = _as_int(value)
    if number is not None:
        return int64_id(number)  # 64 bits kept exactly; wider numbers hashed
    return -1 - zlib.crc32(str(value).encode())  # labels


def _coerce(raw: dict[str, Any]) -> Any:
    """One event decoded without a schema, made to fit the classes above (the slow path)."""
    args = raw.get("args")
    parsed_args = _NO_ARGS
    if isinstance(args, dict):
        dims = args.get("Input Dims")
        types = args.get("Input type")
        parsed_args = _Args(
            external_id=_as_int(args.get("External id")),
            external_id_old=_as_int(args.get("external id")),
            correlation=_as_int(args.get("correlation")),
            nbytes=_as_int(args.get("bytes")),
            collective=_str_or_none(args.get("Collective name")),
            group=_str_or_none(args.get("Process Group Name")),
            in_nelems=_as_int(args.get("In msg nelems")),
            in_split=_raw_of(args.get("In split size")),
            out_split=_raw_of(args.get("Out split size")),
            dtype=_str_or_none(args.get("dtype")),
            input_dims=msgspec.Raw(msgspec.json.encode(dims)) if dims is not None else _NO_RAW,
            input_type=msgspec.Raw(msgspec.json.encode(types)) if types is not None else _NO_RAW,
            concrete_inputs=msgspec.Raw(msgspec.json.encode(concrete))
            if (concrete := args.get("Concrete Inputs")) is not None
            else _NO_RAW,
            meta_name=_str_or_none(args.get("name")),
            grid=_raw_of(args.get("grid")),
            block=_raw_of(args.get("block")),
            total_allocated=_as_int(args.get("Total Allocated")),
            total_reserved=_as_int(args.get("Total Reserved")),
            mem_bytes=_as_int(args.get("Bytes")),
            device_type=_as_int(args.get("Device Type")),
            device_id=_as_int(args.get("Device Id")),
        )
    cls = _CLASS_OF.get(str(raw.get("ph", "")), _Skipped)
    ids = {k: raw.get(k) if isinstance(raw.get(k), int | str) else None for k in ("pid", "tid")}
    if cls is _Meta:
        return _Meta(name=_str_or_none(raw.get("name")), args=parsed_args, **ids)
    if cls in _TIMED:
        return cls(
            cat=_str_or_none(raw.get("cat")),
            name=_str_or_none(raw.get("name")),
            ts=_float_or_none(raw.get("ts")),
            dur=_float_or_none(raw.get("dur")),
            args=parsed_args,
            **ids,
        )
    return cls()


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _raw_of(value: Any) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(value)) if value is not None else _NO_RAW
