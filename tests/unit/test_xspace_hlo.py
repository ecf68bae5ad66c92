"""The XSpace and HLO messages traceview decodes (parsers/xspace_hlo.py: a minimal schema of
its own) against TensorFlow's generated ones: every field it reads has TensorFlow's number and
type, so a profile is read as its writer meant."""

from __future__ import annotations

import pytest

from traceview.parsers.xspace_hlo import SCHEMA

# our message -> TensorFlow's (module, message); map entries are checked through their value
_THEIRS = {
    "XSpace": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XSpace"),
    "XPlane": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XPlane"),
    "XSpaceEvents": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XSpace"),
    "XPlaneEvents": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XPlane"),
    "XLine": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XLine"),
    "XEvent": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XEvent"),
    "XEventMetadata": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XEventMetadata"),
    "XStatMetadata": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XStatMetadata"),
    "XStat": ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "XStat"),
    "HloProto": ("tensorflow.compiler.xla.service.hlo_pb2", "HloProto"),
    "HloModuleProto": ("tensorflow.compiler.xla.service.hlo_pb2", "HloModuleProto"),
    "HloComputationProto": ("tensorflow.compiler.xla.service.hlo_pb2", "HloComputationProto"),
    "HloInstructionProto": ("tensorflow.compiler.xla.service.hlo_pb2", "HloInstructionProto"),
    "OpMetadata": ("tensorflow.compiler.xla.xla_data_pb2", "OpMetadata"),
}


@pytest.mark.parametrize("message", sorted(_THEIRS))
def test_each_field_has_tensorflows_number_and_type(message: str) -> None:
    module_name, theirs = _THEIRS[message]
    module = pytest.importorskip(module_name, reason="TensorFlow's protos are the reference")
    fields = {f.name: f for f in getattr(module, theirs).DESCRIPTOR.fields}
    for name, number, kind, repeated, _ in SCHEMA[message]:
        assert name in fields, (message, name)
        field = fields[name]
        assert field.number == number, (message, name)
        assert field.type == kind, (message, name)
        label_repeated = getattr(field, "is_repeated", None)
        is_repeated = label_repeated if isinstance(label_repeated, bool) else field.label == 3
        assert is_repeated == repeated, (message, name)


def test_map_entries_are_tensorflows_maps() -> None:
    module = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    plane = {f.name: f for f in module.XPlane.DESCRIPTOR.fields}
    for name in ("event_metadata", "stat_metadata"):
        entry = plane[name].message_type
        assert entry.GetOptions().map_entry
        keys = {f.name: (f.number, f.type) for f in entry.fields}
        ours = {
            n: (num, t) for n, num, t, _, _ in SCHEMA[f"{name.split('_')[0].title()}MetadataEntry"]
        }
        assert keys["key"] == ours["key"] and keys["value"][0] == ours["value"][0]
