"""xprof's events read as TensorFlow's (parsers/xplane_events.py), on XSpaces written byte by
byte (tests/hostile_wave4.py's writer): what each event is, and which device's rank it is in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof")


def _parse(tmp_path: Path, planes: dict[str, Any]) -> dict[str | None, Any]:
    from tests.hostile_wave4 import xspace
    from traceview.parsers import tensorflow as T

    path = tmp_path / "host.xplane.pb"
    path.write_bytes(xspace(planes))
    T._read_whole.cache_clear()
    parser = T.XPlaneParser()
    devices = parser.identify(path).devices or [None]
    return {d: parser.parse(path, d) for d in devices}


def _mirrored(steps: int = 3) -> dict[str, Any]:
    """A MirroredStrategy step on two logical CPU devices: each replica's ops (replica 1's
    scoped ``replica_1/``), their collective (one op per replica, told apart by a suffix), and
    the executor's asynchronous receives (``_Recv``: a start and a done), outside every op."""
    train, compute, runtime = [], [], []
    for s in range(steps):
        t = s * 1000.0
        train.append(("train", t, 900.0, {"step_num": s}))
        for r, scope in enumerate(("", "replica_1/")):
            op = f"{scope}dense/MatMul:MatMul"
            compute.append((op.rpartition(":")[2], t + 10 + r * 100, 80.0, {"long_name": op}))
            reduce = f"CollectiveReduceV2{'_1' if r else ''}:CollectiveReduceV2"
            compute.append(
                ("CollectiveReduceV2", t + 300 + r * 100, 50.0,
                 {"long_name": reduce, "instance_key": 100 + s})
            )  # fmt: skip
        for done, at in ((False, 600.0), (True, 700.0)):
            name = f"ExecutorState::ProcessAsync::{'Done' if done else 'Start'}"
            args = {"kernel_type": "_Recv", "step_id": 7 + s, "name": "edge_1"}
            runtime.append((name, t + at, 5.0, args))
    return {"/host:CPU": {"python3": train, "tf_Compute": compute, "tf_runtime": runtime}}


def test_each_replicas_ops_and_collective_are_its_own(tmp_path: Path) -> None:
    parsed = _parse(tmp_path, _mirrored())
    assert list(parsed) == ["CPU:0", "CPU:1"]
    for device, scope in (("CPU:0", ""), ("CPU:1", "replica_1/")):
        events = parsed[device].events
        names = events.column("name").to_pylist()
        cats = events.column("cat").to_pylist()
        ops = sorted({n for n, c in zip(names, cats, strict=True) if c == "tf_op"})
        # the collective named as replica 0's (one call of both), matched across them
        assert ops == sorted(
            [f"{scope}dense/MatMul:MatMul", "CollectiveReduceV2:CollectiveReduceV2"]
        )


def test_the_executors_receives_are_no_replicas_own(tmp_path: Path) -> None:
    """A receive's start and done are the runtime's (shared, read with the first device), not
    a replica's: the key that pairs them (step and edge) is no collective's instance key."""
    parsed = _parse(tmp_path, _mirrored())
    for device, expected in (("CPU:0", 3), ("CPU:1", 0)):
        names = parsed[device].events.column("name").to_pylist()
        for half in ("Start", "Done"):
            assert names.count(f"ExecutorState::ProcessAsync::{half}") == expected, device


def test_what_each_event_is_on_a_gpu_plane(tmp_path: Path) -> None:
    """Kernels, copies (their size from the copy's details) and memsets on a GPU's stream,
    xprof's derived lines left out, a numbered Steps line read as steps and an unnumbered one
    left out; an instant (no duration) is no event."""
    host = {"python3": [("train", s * 1000.0, 900.0, {"step_num": s}) for s in range(2)]}
    stream = [
        ("volta_sgemm", 10.0, 50.0, {"long_name": "m/MatMul:MatMul#shape=[2]#"}),
        ("MemcpyH2D", 70.0, 5.0, {"memcpy_details": "kind:HtoD size:4096"}),
        ("memset32", 80.0, 2.0, {}),
        ("marker", 85.0, 0.0, {}),
    ]
    gpu = {
        "Stream #1(Compute)": stream,
        "TensorFlow Ops": [("MatMul", 10.0, 50.0, {})],
        "Steps": [("0", 5.0, 900.0, {}), ("x", 1005.0, 900.0, {})],
    }
    parsed = _parse(tmp_path, {"/host:CPU": host, "/device:GPU:0": gpu})
    (rank,) = parsed.values()
    rows = rank.events.select(["cat", "name", "scope", "bytes"]).to_pylist()
    device = [r for r in rows if r["cat"] != "tf_step"]
    assert device == [
        {"cat": "tf_kernel", "name": "volta_sgemm", "scope": "m/MatMul:MatMul", "bytes": None},
        {"cat": "tf_memcpy", "name": "MemcpyH2D", "scope": None, "bytes": 4096},
        {"cat": "tf_memset", "name": "memset32", "scope": None, "bytes": None},
    ]
    assert rank.skipped["derived"] == 2  # (the op line's MatMul and the unnumbered step)
    assert rank.skipped["other"] == 1  # (the instant)
