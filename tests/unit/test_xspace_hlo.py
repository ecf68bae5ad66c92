"""The XSpace and HLO messages traceview decodes (parsers/xspace_hlo.py: a minimal schema of
its own) against TensorFlow's generated ones: every field it reads has TensorFlow's number and
type, so a profile is read as its writer meant."""

from __future__ import annotations

from pathlib import Path

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


def _xprofs_census(path: Path) -> tuple[int | None, dict[str, int]]:
    """The session's start and each plane's lines as xprof's own reader (ProfileData) gives
    them: the reference."""
    profile_data = pytest.importorskip("xprof.profile_data", reason="xprof's reader: the reference")
    start, lines = None, {}
    for plane in profile_data.ProfileData.from_file(str(path)).planes:
        lines[plane.name] = sum(1 for _ in plane.lines)
        for key, value in plane.stats:
            if key == "profile_start_time" and start is None:
                start = int(value)
    return start, lines


def test_the_census_is_xprofs_own_reading_of_the_sample_profiles() -> None:
    """Each plane's lines (what the parser compares xprof's trace events with: the planes as
    written) and the session's start, as xprof reads them."""
    from tests.conftest import SAMPLES
    from traceview.parsers.xspace_hlo import hlo_facts

    samples = sorted((SAMPLES / "tensorflow").glob("*/rank-*.xplane.pb"))
    assert samples
    for path in samples:
        facts = hlo_facts(path)
        assert (facts.start_ns, facts.lines) == _xprofs_census(path), path
        assert facts.start_ns is not None and any(facts.lines.values())


def test_the_census_counts_each_planes_lines_and_finds_the_start(tmp_path: Path) -> None:
    """Planes of several lines, an empty line, a plane of none; the start recorded by a later
    plane than the first (the first has no stats): as xprof reads them; no XSpace: nothing."""
    from tests.hostile_wave4 import T0, xspace
    from traceview.parsers.xspace_hlo import hlo_facts

    path = tmp_path / "host.xplane.pb"
    events = [("op", 1.0, 1.0, {})]
    path.write_bytes(
        xspace({"/host:CPU": {"a": events, "b": events, "c": []}, "/device:GPU:0": {"s": events}})
    )
    facts = hlo_facts(path)
    assert facts.lines == {"/host:CPU": 3, "/device:GPU:0": 1, "Task Environment": 0}
    assert facts.start_ns == T0
    assert (facts.start_ns, facts.lines) == _xprofs_census(path)
    path.write_bytes(b"\xff\xff")
    nothing = hlo_facts(path)
    assert (nothing.start_ns, nothing.lines) == (None, {})
