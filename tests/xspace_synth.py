"""XSpace profiles written for tests, with TensorFlow's own protobuf messages (the tests that
use them skip where TensorFlow is absent): a host plane and device planes, each line a list of
events ``(name, start_us, duration_us, stats)`` on the line's clock (the plane's
``timestamp_ns`` plus the offset), for the shapes real profiles do not give on demand: a TPU's
planes, a plane without events, a device of a kind traceview does not know, a step line on
some devices only, a device clock far from the host's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Event = tuple[str, float, float, dict[str, Any]]


def write_xspace(
    path: Path,
    planes: dict[str, dict[str, list[Event]]],
    start_ns: int = 1_700_000_000_000_000_000,
    plane_stats: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """``planes``: plane name -> line name -> events (start and duration in µs from
    ``start_ns``). A "Task Environment" plane records ``start_ns`` as the profile's start."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    for plane_id, (plane_name, lines) in enumerate(planes.items()):
        plane = space.planes.add(id=plane_id, name=plane_name)
        names: dict[str, int] = {}
        stat_names: dict[str, int] = {}

        def stat_id(name: str, plane: Any = plane, stat_names: dict[str, int] = stat_names) -> int:
            if name not in stat_names:
                stat_names[name] = len(stat_names) + 1
                plane.stat_metadata[stat_names[name]].id = stat_names[name]
                plane.stat_metadata[stat_names[name]].name = name
            return stat_names[name]

        for key, value in ((plane_stats or {}).get(plane_name) or {}).items():
            _set(plane.stats.add(metadata_id=stat_id(key)), value)
        for line_id, (line_name, events) in enumerate(lines.items()):
            line = plane.lines.add(id=line_id + 1, display_id=line_id + 1, name=line_name)
            line.timestamp_ns = start_ns
            for name, start_us, dur_us, stats in events:
                if name not in names:
                    names[name] = len(names) + 1
                    plane.event_metadata[names[name]].id = names[name]
                    plane.event_metadata[names[name]].name = name
                event = line.events.add(
                    metadata_id=names[name],
                    offset_ps=round(start_us * 1e6),
                    duration_ps=round(dur_us * 1e6),
                )
                for key, value in stats.items():
                    _set(event.stats.add(metadata_id=stat_id(key)), value)
    environment = space.planes.add(id=len(planes), name="Task Environment")
    environment.stat_metadata[1].id = 1
    environment.stat_metadata[1].name = "profile_start_time"
    environment.stats.add(metadata_id=1, uint64_value=start_ns)
    path.write_bytes(space.SerializeToString())
    return path


def _set(stat: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        stat.str_value = str(value)
    elif isinstance(value, int):
        stat.int64_value = value
    else:
        stat.double_value = value
