"""The integration tier's part of ``tests/unit/test_step_inference.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import gzip
import json

import pyarrow.compute as pc
import pytest

from tests.conftest import SHARED, parser_of
from tests.unit.test_step_inference import _markers, _normalize
from traceview.model import schema as S
from traceview.model.errors import Notes
from traceview.normalize.classify import kinds_from_categories
from traceview.normalize.rules import rules_for
from traceview.normalize.steps import step_markers


def test_real_xspace_steps_are_its_step_groups_as_xprof_reads_them() -> None:
    """The shared GPU profile has no step markers; each inferred marker lasts from the first start
    to the last end of its group's host events, as xprof's ProfileData reads the XSpace directly
    (another path than the trace-viewer events the parser reads: durations are on both clocks)."""
    pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof")
    from xprof.profile_data import ProfileData

    paths = sorted((SHARED / "tensorflow" / "tfprofiler_gpu_multi_worker").glob("*.xplane.pb"))
    if not paths:
        pytest.skip(f"the shared TensorFlow GPU profile is not in {SHARED}")
    spans: dict[int, list[int]] = {}
    for plane in ProfileData.from_file(str(paths[0])).planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                for event in line.events:
                    stats = dict(event.stats)
                    if "group_id" in stats:
                        start, end = int(event.start_ns), int(event.start_ns + event.duration_ns)
                        span = spans.setdefault(int(stats["group_id"]), [start, end])
                        span[0], span[1] = min(span[0], start), max(span[1], end)
    assert len(spans) > 1
    parsed = parser_of(paths[0]).parse(paths[0])  # type: ignore[union-attr]
    assert parsed.infer_steps == "step_groups"
    assert "tf_step" not in parsed.events.column(S.CAT).to_pylist(), "the parser makes no steps"
    raw = kinds_from_categories(parsed.events, rules_for("tensorflow"))  # the pass before
    inferred = step_markers(raw, "step_groups", parsed.process_names, Notes())
    assert inferred is not None
    markers = inferred.markers
    names = markers.column(S.NAME).to_pylist()
    durations = pc.subtract(
        pc.add(markers.column(S.TS_NS), markers.column(S.DUR_NS)), markers.column(S.TS_NS)
    ).to_pylist()
    assert dict(zip(names, durations, strict=True)) == {
        f"step {g}": end - start for g, (start, end) in spans.items()
    }


def test_real_timeline_steps_start_at_each_session_runs_source_node() -> None:
    """The merged Timeline of five Session.run calls, read here as plain JSON: one step from each
    _SOURCE node of the CPU device to the next."""
    path = (
        SHARED / "tensorflow" / "tf1_timeline_mnist_mlp_cpu" / "timeline_03_merged_5_runs.json.gz"
    )
    if not path.exists():
        pytest.skip(f"the shared TF1 Timeline traces are not in {SHARED}")
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document["traceEvents"] if isinstance(document, dict) else document
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    sources = sorted(
        round(e["ts"] * 1000)
        for e in events
        if e.get("ph") == "X"
        and e.get("args", {}).get("name") == "_SOURCE"
        and "cpu" in processes.get(e["pid"], "").lower()
    )
    assert len(sources) == 5
    parsed = parser_of(path).parse(path)  # type: ignore[union-attr]
    assert parsed.infer_steps == "session_runs"
    assert "tf_step" not in parsed.events.column(S.CAT).to_pylist(), "the parser makes no steps"
    markers = _markers(_normalize(parsed.events, "session_runs", parsed.process_names))
    assert [m[0] for m in markers] == [0, 1, 2, 3, 4]
    assert [m[3] for m in markers] == sources
    assert [m[4] for m in markers[:-1]] == sources[1:]
