#!/usr/bin/env python3
"""TensorFlow profiles (``.xplane.pb``) of about 12 MB (issue 55: no 12 MB trace, however shaped,
takes more than 5 s), side by side in one run, each command a fresh process measured by
_measure.py (wall seconds, CPU seconds, peak RSS and PSS of the process tree; interpreter start
and imports included), median of --repeat runs:

- ``XSpace.FromString`` of the file (TensorFlow's protobuf class, without importing the rest
  of TensorFlow): the decode alone;
- xprof's own trace viewer conversion (``raw_to_tool_data.xspace_to_tool_data(...,
  "trace_viewer")``: what TensorBoard's profile plugin runs to show the trace);
- ``traceview ingest`` of the file (the report kept with it).

The profiles (written with TensorFlow's protobuf classes, so TensorFlow must be installed):

- "CPU, 2 workers": the repository's MultiWorkerMirrored sample (rank 0) repeated in time
  until it reaches --mb, its step numbers, groups and ids renumbered in each copy;
- "GPU, multi-worker": the shared folder's GPU profile (../shared/traces, where present)
  repeated the same way: kernels, copies, their launches and correlation ids;
- "dense host": one host thread of one-microsecond events 2 µs apart, about 15 bytes an event
  (far denser than a real profile, whose events carry their statistics).

    python benchmarks/bench_xplane.py [--repeat 3] [--mb 12]

Results go to benchmarks/results/xplane.{json,md}.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from _measure import compiled  # type: ignore[import-not-found]
from bench_fixed_costs import Table  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MWMS = REPO / "sample_traces" / "tensorflow" / "mwms" / "rank-0.xplane.pb"
GPU = (
    REPO.parent
    / "shared/traces/tensorflow/tfprofiler_gpu_multi_worker/34.83.195.179_6003.xplane.pb"
)
#: Stats that number steps, groups and launches: renumbered in each copy of a profile
_NUMBERED = ("step_num", "group_id", "iter_num", "step_id", "correlation_id")

# (TensorFlow's xplane_pb2 loaded as a file: importing the tensorflow package takes seconds)
_DECODE = """
import importlib.util, os, sys
top = importlib.util.find_spec("tensorflow").submodule_search_locations[0]
path = os.path.join(top, "tsl", "profiler", "protobuf", "xplane_pb2.py")
spec = importlib.util.spec_from_file_location("xplane_pb2", path)
xplane_pb2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(xplane_pb2)
xplane_pb2.XSpace.FromString(open(sys.argv[1], "rb").read())
"""
_XPROF = """
import sys
from xprof.convert import raw_to_tool_data
raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "trace_viewer", {})
"""


def repeated(source: Path, out: Path, mb: float) -> int:
    """``source``'s events repeated one after the other until the file reaches ``mb``; returns
    the number of events."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace.FromString(source.read_bytes())
    span, top = 0, dict.fromkeys(_NUMBERED, 0)
    for plane in space.planes:
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                span = max(span, e.offset_ps + e.duration_ps)
                for stat in e.stats:
                    name = names.get(stat.metadata_id)
                    if name in top:
                        value = getattr(stat, stat.WhichOneof("value") or "int64_value")
                        top[name] = max(top[name], int(value) if isinstance(value, int) else 0)
    per_copy = sum(
        e.ByteSize() + 4 for plane in space.planes for line in plane.lines for e in line.events
    )
    copies = max(1, 1 + math.ceil((mb * 1e6 - space.ByteSize()) / per_copy))
    whole = xplane_pb2.XSpace()
    whole.CopyFrom(space)
    events = 0
    for plane_out, plane in zip(whole.planes, space.planes, strict=True):
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line_out, line in zip(plane_out.lines, plane.lines, strict=True):
            for copy in range(1, copies):
                for e in line.events:
                    new = line_out.events.add()
                    new.CopyFrom(e)
                    new.offset_ps = e.offset_ps + copy * (span + 1_000_000)
                    if line.name == "Steps":  # (xprof's step line: named by the step's number)
                        new.metadata_id = _step_name(plane_out, e.metadata_id, copy * 1000)
                    for stat in new.stats:
                        name = names.get(stat.metadata_id)
                        kind = stat.WhichOneof("value")
                        if name in top and kind in ("int64_value", "uint64_value"):
                            setattr(stat, kind, getattr(stat, kind) + copy * (top[name] + 1))
            events += len(line_out.events)
    out.write_bytes(whole.SerializeToString())
    return events


def _step_name(plane: Any, metadata_id: int, shift: int) -> int:
    """The id of an event name of ``plane``: the name of ``metadata_id`` (a step's number)
    plus ``shift``, made where the plane has none."""
    name = plane.event_metadata[metadata_id].name
    if not name.strip().isdigit():
        return metadata_id
    wanted = str(int(name) + shift)
    for number, entry in plane.event_metadata.items():
        if entry.name == wanted:
            return int(number)
    number = max(plane.event_metadata) + 1
    plane.event_metadata[number].id = number
    plane.event_metadata[number].name = wanted
    return number


def dense(out: Path, mb: float) -> int:
    """One host thread of one-microsecond events, two names alternating, until ``mb``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    for number, name in ((1, "MatMul"), (2, "Relu")):
        plane.event_metadata[number].id = number
        plane.event_metadata[number].name = name
    line = plane.lines.add(id=1, display_id=1, name="tf_Compute")
    line.timestamp_ns = 1_700_000_000_000_000_000
    n = 0
    while space.ByteSize() < mb * 1e6:
        for _ in range(10_000):
            line.events.add(metadata_id=1 + n % 2, offset_ps=n * 2_000_000, duration_ps=1_000_000)
            n += 1
    out.write_bytes(space.SerializeToString())
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--mb", type=float, default=12.0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "xplane")
    args = p.parse_args()
    compiled(sys.executable)  # (as an install from a wheel has it)
    tv = [sys.executable, "-m", "traceview"]
    table = Table(args.repeat)
    row = table.row
    with tempfile.TemporaryDirectory(prefix="bench-xplane-") as tmp:
        folder = Path(tmp)
        shapes = [("CPU, 2 workers", lambda out: repeated(MWMS, out, args.mb))]
        if GPU.is_file():
            shapes.append(("GPU, multi-worker", lambda out: repeated(GPU, out, args.mb)))
        else:
            print(f"(no {GPU}: the GPU profile left out)")
        shapes.append(("dense host", lambda out: dense(out, args.mb)))
        for label, make in shapes:
            trace = folder / "host.xplane.pb"
            events = make(trace)
            group = f"{label}: {trace.stat().st_size / 1e6:.1f} MB, {events:,} events"
            row(group, "XSpace decode", [sys.executable, "-c", _DECODE, str(trace)])
            row(group, "xprof trace_viewer", [sys.executable, "-c", _XPROF, str(trace)])
            run = folder / "run"
            argv = ["/bin/sh", "-c", f'rm -rf "{run}" && exec "$@"', "-", *tv, "ingest",
                    str(trace), "-o", str(run)]  # fmt: skip
            row(group, "traceview ingest", argv)
            shutil.rmtree(run, ignore_errors=True)
    table.write(
        args.out,
        "RSS: peak of the process tree; PSS: its peak with the pages a forked child shares with "
        "its parent counted once.",
        "| profile | command | wall s | CPU s | peak RSS MB | peak PSS MB |",
        lambda r: f"{r['wall_s']:.3f} | {r['cpu_s']:.3f} | {r['rss_mb']:.0f} | {r['pss_mb']:.0f}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
