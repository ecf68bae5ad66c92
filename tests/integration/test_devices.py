"""One process, many devices: an XSpace of several devices read as one rank per device.

The expectations come from the profile itself, read with xprof's own reader (ProfileData: the
XSpace's planes, lines and events as written), never from traceview's output: each device's
steps are its plane's ``Steps`` line, its events its plane's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


# --- shapes real profiles do not give on demand (tests/xspace_synth.py) ------------------------


def _tpu_lines(slow: float, steps: int = 4, own_steps: bool = True) -> dict[str, list[Any]]:
    """A TPU's plane as JAX's profiles lay it out: its program's executions on "XLA Modules",
    its ops on "XLA Ops" (a fusion, then an all-reduce), xprof's "Steps"; ms -> µs."""
    ops: list[Any] = []
    for s in range(steps):
        t = s * 10_000.0 + 500
        ops.append(("fusion.1", t, 3000.0 * slow, {"hlo_op": "fusion.1", "hlo_module": "jit_step"}))
        t += 3000.0 * slow + 100
        ops.append(
            ("all-reduce.3", t, 1000.0, {"hlo_op": "all-reduce.3", "hlo_module": "jit_step"})
        )
    lines: dict[str, list[Any]] = {
        "XLA Modules": [("jit_step(1)", s * 10_000.0 + 400, 8000.0, {}) for s in range(steps)],
        "XLA Ops": ops,
    }
    if own_steps:
        lines["Steps"] = [(str(s), s * 10_000.0 + 400, 8000.0, {}) for s in range(steps)]
    return lines


def _host(steps: int = 4) -> dict[str, list[Any]]:
    return {"python3": [("train", s * 10_000.0, 9000.0, {"step_num": s}) for s in range(steps)]}


@pytest.fixture
def synth(tmp_path: Path) -> Any:
    pytest.importorskip(
        "tensorflow", reason="the test profiles are written with TensorFlow's protos"
    )
    from tests.xspace_synth import write_xspace

    def make(planes: dict[str, Any], name: str = "host") -> Path:
        return write_xspace(tmp_path / f"{name}.xplane.pb", planes)

    return make


def test_a_tpu_profile_reads_each_chip_as_a_rank_with_its_ops_and_all_reduce(synth: Any) -> None:
    """Two TPU chips: their ops are on "XLA Ops" (no streams), each chip a rank of a JAX run
    (its programs are named jit_...), its all-reduce communication; no GPU in the words."""
    path = synth(
        {"/host:CPU": _host(), "/device:TPU:0": _tpu_lines(1.0), "/device:TPU:1": _tpu_lines(2.0)}
    )
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert report["run"]["framework"] == "jax"
    assert [r["device"] for r in report["ranks"]] == ["TPU:0", "TPU:1"]
    for rank, slow in ((0, 1.0), (1, 2.0)):
        row = report["ranks"][rank]
        assert row["step_ms"] == pytest.approx(8.0, abs=0.01)  # its own Steps line
        assert row["comm_total_ms"] == pytest.approx(1.0, abs=0.01)  # the all-reduce
        busy = row["step_ms"] - row["breakdown_ms"]["idle"]
        assert busy == pytest.approx(3.0 * slow + 1.0, abs=0.01)
    text = run_cli("report", path).out
    assert "TPU device timeline" in text.splitlines()[0] and "GPU" not in text


def test_bad_device_shapes_are_read_as_far_as_they_go_and_named(synth: Any) -> None:
    """A plane of a kind xprof drops, a plane without events, a device without a step line of
    its own where the others have one, a device on a clock far from the host's: every
    readable device is a rank, each oddity named once, nothing raises."""
    far = {
        line: [(n, t + 3_600_000_000.0, d, st) for n, t, d, st in events]
        for line, events in _tpu_lines(1.0).items()
    }
    path = synth(
        {
            "/host:CPU": _host(),
            "/device:TPU:0": _tpu_lines(1.0),
            "/device:TPU:1": _tpu_lines(1.5, own_steps=False),
            "/device:TPU:2": {},
            "/device:TPU:3": far,
            "/device:XPU:0": {"Stream #1(Compute)": [("kernel", 100.0, 50.0, {})]},
        }
    )
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert [r["device"] for r in report["ranks"]] == ["TPU:0", "TPU:1", "TPU:3"]
    said = report["warnings"] + report["remarks"]
    for fragment in (
        "/device:XPU:0",  # xprof does not read it
        "without events: TPU:2",
        "TPU:1 without a step line of their own",
        "events of TPU:3 lie outside the host's profiled window",
    ):
        assert sum(fragment in line for line in said) == 1, (fragment, said)


def test_a_jax_profile_without_markers_has_a_step_per_execution_of_its_main_program(
    synth: Any,
) -> None:
    """No StepTraceAnnotation and no step lines: each host call of the program run most
    (jit_step, 5 calls; jit_init once) is a step, each device's stretched to the end of its ops
    of that execution (the call returns at once: JAX dispatches asynchronously)."""
    calls = [
        ("CommonPjRtLoadedExecutable::Execute", 0.0, 50.0, {"run_id": 100, "name": "jit_init"}),
        *[
            ("CommonPjRtLoadedExecutable::Execute", 1000.0 + s * 10_000.0, 50.0,
             {"run_id": s, "name": "jit_step"})
            for s in range(5)
        ],
    ]  # fmt: skip

    def device(slow: float) -> dict[str, list[Any]]:
        ops = []
        for s in range(5):
            t = 1000.0 + s * 10_000.0 + 100
            stats = {"hlo_op": "fusion.1", "hlo_module": "jit_step", "run_id": s}
            ops.append(("fusion.1", t, 3000.0 * slow, stats))
        return {"XLA Ops": ops}

    path = synth(
        {
            "/host:CPU": {"python3": calls},
            "/device:TPU:0": device(1.0),
            "/device:TPU:1": device(2.0),
        }
    )
    result = run_cli("report", path, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert report["run"]["framework"] == "jax"
    steps = {s["step"] for s in report["per_step"]}
    assert steps == {0, 1, 2, 3, 4}, report["per_step"]
    assert any("each call of the XLA program jit_step" in r for r in report["remarks"])
