"""What xprof's trace events leave out of an XSpace: the XLA programs each profile carries on its
``/host:metadata`` plane (as ``Hlo Proto`` stats), whose instructions name the framework op
they come from (JAX: ``jit(step)/jvp(loss)/dot_general`` for forward,
``.../transpose(jvp(loss))/...`` for backward), and that plane's own stats (``jax_version``...);
each plane's number of lines and the session's start (read once with those); and, with the
lines and their events (``space_with_events``), what the parser reads of the
events themselves beside xprof (TensorFlow's memory records).

Read with protobuf from a minimal schema of the few messages needed, field numbers as in
``tsl/profiler/protobuf/xplane.proto`` and ``xla/service/hlo.proto`` (the tests check them
against TensorFlow's own where it is installed). proto2, so a name that is not UTF-8 is read,
not refused; every other field of the file is skipped by the decoder.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

METADATA_PLANE = "/host:metadata"
HLO_PROTO_STAT = "Hlo Proto"

# message -> [(field, number, type, repeated, message type)]: descriptor_pb2's type numbers
_INT64, _UINT64, _DOUBLE, _STRING, _BYTES, _MESSAGE = 3, 4, 1, 9, 12, 11
SCHEMA: dict[str, list[tuple[str, int, int, bool, str | None]]] = {
    "XSpace": [("planes", 1, _MESSAGE, True, "XPlane")],
    "XPlane": [
        ("name", 2, _STRING, False, None),
        ("lines", 3, _MESSAGE, True, "XLineUnread"),  # (counted only)
        ("event_metadata", 4, _MESSAGE, True, "EventMetadataEntry"),
        ("stat_metadata", 5, _MESSAGE, True, "StatMetadataEntry"),
        ("stats", 6, _MESSAGE, True, "XStat"),
    ],
    # the same messages with each plane's lines and their events (the memory records)
    "XSpaceEvents": [("planes", 1, _MESSAGE, True, "XPlaneEvents")],
    "XPlaneEvents": [
        ("name", 2, _STRING, False, None),
        ("lines", 3, _MESSAGE, True, "XLine"),
        ("event_metadata", 4, _MESSAGE, True, "EventMetadataEntry"),
        ("stat_metadata", 5, _MESSAGE, True, "StatMetadataEntry"),
    ],
    "XLineUnread": [],  # (a line whose fields are skipped)
    "XLine": [
        ("name", 2, _STRING, False, None),
        ("timestamp_ns", 3, _INT64, False, None),
        ("events", 4, _MESSAGE, True, "XEvent"),
    ],
    "XEvent": [
        ("metadata_id", 1, _INT64, False, None),
        ("offset_ps", 2, _INT64, False, None),
        ("stats", 4, _MESSAGE, True, "XStat"),
    ],
    "EventMetadataEntry": [
        ("key", 1, _INT64, False, None),
        ("value", 2, _MESSAGE, False, "XEventMetadata"),
    ],
    "XEventMetadata": [
        ("id", 1, _INT64, False, None),
        ("name", 2, _STRING, False, None),
        ("stats", 5, _MESSAGE, True, "XStat"),
    ],
    "StatMetadataEntry": [
        ("key", 1, _INT64, False, None),
        ("value", 2, _MESSAGE, False, "XStatMetadata"),
    ],
    "XStatMetadata": [("id", 1, _INT64, False, None), ("name", 2, _STRING, False, None)],
    "XStat": [
        ("metadata_id", 1, _INT64, False, None),
        ("double_value", 2, _DOUBLE, False, None),
        ("uint64_value", 3, _UINT64, False, None),
        ("int64_value", 4, _INT64, False, None),
        ("str_value", 5, _STRING, False, None),
        ("bytes_value", 6, _BYTES, False, None),
        ("ref_value", 7, _UINT64, False, None),
    ],
    "HloProto": [("hlo_module", 1, _MESSAGE, False, "HloModuleProto")],
    "HloModuleProto": [
        ("name", 1, _STRING, False, None),
        ("computations", 3, _MESSAGE, True, "HloComputationProto"),
    ],
    "HloComputationProto": [
        ("name", 1, _STRING, False, None),
        ("instructions", 2, _MESSAGE, True, "HloInstructionProto"),
    ],
    "HloInstructionProto": [
        ("name", 1, _STRING, False, None),
        ("opcode", 2, _STRING, False, None),
        ("metadata", 7, _MESSAGE, False, "OpMetadata"),
    ],
    "OpMetadata": [("op_type", 1, _STRING, False, None), ("op_name", 2, _STRING, False, None)],
}


@functools.cache
def _classes() -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(
        name="traceview_xspace.proto", package="traceview_xspace", syntax="proto2"
    )
    for message, fields in SCHEMA.items():
        proto = file.message_type.add(name=message)
        for name, number, kind, repeated, type_name in fields:
            field = proto.field.add(name=name, number=number, type=kind)
            field.label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            if type_name is not None:
                field.type_name = f".traceview_xspace.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        m: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"traceview_xspace.{m}"))
        for m in ("XSpace", "XSpaceEvents", "HloProto")
    }


def space_with_events(path: Path) -> Any | None:
    """The XSpace at ``path`` with its planes' lines and events (``XSpaceEvents``), None where
    it cannot be read."""
    try:
        from google.protobuf.message import DecodeError
    except ImportError:  # pragma: no cover - protobuf comes with xprof
        return None
    space = _classes()["XSpaceEvents"]()
    try:
        space.ParseFromString(path.read_bytes())
    except (DecodeError, OSError, ValueError, RuntimeError):
        return None
    return space


def _stat_value(stat: Any) -> Any:
    for field in ("str_value", "int64_value", "uint64_value", "double_value"):
        if stat.HasField(field):
            return getattr(stat, field)
    return None


class HloFacts:
    """What the metadata plane says: the XLA programs, by module name (one name may be several
    programs: a function compiled again for other shapes or donations), each its ops' framework
    op names; and the plane's stats (versions of the framework that wrote the profile). Of the
    whole XSpace: each plane's number of lines (by name: the planes as written, before xprof's
    trace events leave out those it does not know), and the session's profile_start_time (Unix
    ns, from the first plane that records it)."""

    def __init__(
        self,
        programs: dict[str, list[dict[str, str]]],
        stats: dict[str, Any],
        lines: dict[str, int] | None = None,
        start_ns: int | None = None,
    ):
        self.programs = programs
        self.stats = stats
        self.lines = lines or {}
        self.start_ns = start_ns

    def op_names(self, module: str, ran: set[str]) -> dict[str, str]:
        """The framework op names of ``module``'s ops, from its program that holds the most of
        the ops that ran (``ran``: the profile's events name the module, not the program)."""
        programs = self.programs.get(module, [])
        if not programs:
            return {}
        return max(programs, key=lambda ops: len(ran.intersection(ops)))


NOTHING = HloFacts({}, {})


def hlo_facts(path: Path) -> HloFacts:
    """The XLA programs' op names and the metadata plane's stats (empty where the file holds
    none, or cannot be read that far: the events are read all the same)."""
    try:
        from google.protobuf.message import DecodeError
    except ImportError:  # pragma: no cover - protobuf comes with xprof
        return NOTHING
    classes = _classes()
    space = classes["XSpace"]()
    try:
        space.ParseFromString(path.read_bytes())
    except (DecodeError, OSError, ValueError, RuntimeError):
        return NOTHING
    programs: dict[str, list[dict[str, str]]] = {}
    stats: dict[str, Any] = {}
    lines: dict[str, int] = {}
    start_ns: int | None = None
    for plane in space.planes:
        lines[plane.name] = len(plane.lines)
        if start_ns is None and len(plane.stats):
            start_ns = _start_ns(plane)
        if plane.name != METADATA_PLANE:
            continue
        stat_names = {e.key: e.value.name for e in plane.stat_metadata}
        for stat in plane.stats:
            name = stat_names.get(stat.metadata_id)
            if name:
                stats[name] = _stat_value(stat)
        for entry in plane.event_metadata:
            for stat in entry.value.stats:
                if stat_names.get(stat.metadata_id) != HLO_PROTO_STAT:
                    continue
                _add_program(classes["HloProto"], stat.bytes_value, programs)
    return HloFacts(programs, stats, lines, start_ns)


def _start_ns(plane: Any) -> int | None:
    """The plane's profile_start_time stat, where it has one that is a number."""
    names = {e.key: e.value.name for e in plane.stat_metadata}
    for stat in plane.stats:
        if names.get(stat.metadata_id) == "profile_start_time":
            value = _stat_value(stat)
            if isinstance(value, int | float) and math.isfinite(value):
                return int(value)
    return None


def _add_program(hlo_class: Any, blob: bytes, programs: dict[str, list[dict[str, str]]]) -> None:
    from google.protobuf.message import DecodeError

    hlo = hlo_class()
    try:
        hlo.ParseFromString(blob)
    except (DecodeError, ValueError, RuntimeError):
        return
    ops = {
        instruction.name: instruction.metadata.op_name
        for computation in hlo.hlo_module.computations
        for instruction in computation.instructions
        if instruction.metadata.op_name
    }
    programs.setdefault(hlo.hlo_module.name, []).append(ops)
