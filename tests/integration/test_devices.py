"""One process, many devices: an XSpace of several devices read as one rank per device.

The expectations come from the profile itself, read with xprof's own reader (ProfileData: the
XSpace's planes, lines and events as written), never from traceview's output: each device's
steps are its plane's ``Steps`` line, its events its plane's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, shared_traces

pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof: pip install '.[tensorflow]'")

BERT = "tensorflow/tfprofiler_gpu_multi_worker/34.83.195.179_6003.xplane.pb"


def _device_planes(path: Path) -> dict[str, dict[str, list[tuple[int, int]]]]:
    """Each device plane's lines: (start_ns, duration_ns) of every event, by line name."""
    from xprof.profile_data import ProfileData

    planes: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for plane in ProfileData.from_file(str(path)).planes:
        if not plane.name.startswith("/device:"):
            continue
        lines = planes.setdefault(plane.name.removeprefix("/device:"), {})
        for line in plane.lines:
            lines.setdefault(line.name, []).extend(
                (int(e.start_ns), int(e.duration_ns)) for e in line.events
            )
    return planes


def test_each_gpu_of_a_mirrored_worker_is_a_rank_with_its_own_steps() -> None:
    """The multi-worker BERT XSpace: one TensorFlow process drove 8 GPUs, two of which ran
    kernels (GPU:4 and GPU:6). Each is a rank, on its host; its step is its own plane's
    ``Steps`` line (xprof's), to the microsecond; GPU:1, which only received copies, is no rank
    and is named in a warning."""
    path = shared_traces(BERT)
    planes = _device_planes(path)
    working = sorted(
        d
        for d, lines in planes.items()
        if any(n.startswith("Stream") and "Compute" in n for n in lines)
    )
    assert working == ["GPU:4", "GPU:6"]
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert report["run"]["framework"] == "tensorflow"
    assert report["run"]["ranks"] == 2 and report["run"]["world_size"] == 2
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert [ranks[r]["device"] for r in (0, 1)] == working
    assert {ranks[r]["host"] for r in (0, 1)} == {"34.83.195.179_6003"}
    for rank, device in enumerate(working):
        (step,) = planes[device]["Steps"]
        assert ranks[rank]["step_ms"] == pytest.approx(step[1] / 1e6, abs=0.001), device
    assert any("GPU:1 (19)" in w for w in report["warnings"]), report["warnings"]


def test_a_profile_of_one_device_is_one_rank_as_before(tmp_path: Path) -> None:
    """A TensorFlow worker's XSpace of one CPU device (sample_traces/tensorflow/mwms) is still
    one rank per file: no device of its own to split by."""
    from tests.conftest import SAMPLES

    result = run_cli("report", SAMPLES / "tensorflow" / "mwms", "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert report["run"]["ranks"] == 2
    assert all(r["device"] is None for r in report["ranks"])
