"""The one attribution rule, instant by instant, on small timelines whose answer is known.

Each case lays out events the way Kineto reports them (names the PyTorch rules know), runs the
real normalize + breakdown, and checks the exclusive time of every phase in microseconds.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from traceview.analysis.attribution import breakdown
from traceview.model import schema as S
from traceview.normalize.pipeline import RankMeta, normalize
from traceview.normalize.rules import builtin_rules

MAIN, GLOO, GPU_STREAM, COMM_STREAM, AUTOGRAD = 100, 200, 7, 13, 300


def ev(
    name: str,
    ts: int,
    dur: int,
    *,
    kind: str = S.KIND_OP,
    tid: int = MAIN,
    pid: int = 1,
    corr: int | None = None,
    cat: str | None = None,
) -> dict[str, Any]:
    """One event; times in microseconds."""
    return {
        S.KIND: kind,
        S.CAT: cat,
        S.NAME: name,
        S.PID: pid,
        S.TID: tid,
        S.TS_NS: ts * 1000,
        S.DUR_NS: dur * 1000,
        S.CORRELATION: corr,
        S.EXTERNAL_ID: None,
        S.BYTES: None,
        S.COLLECTIVE: None,
    }


def kernel(
    name: str, ts: int, dur: int, corr: int, stream: int = GPU_STREAM, kind: str = S.KIND_KERNEL
) -> dict[str, Any]:
    return ev(name, ts, dur, kind=kind, pid=0, tid=stream, corr=corr)


def launch(ts: int, corr: int, tid: int = MAIN) -> dict[str, Any]:
    return ev("cudaLaunchKernel", ts, 1, kind=S.KIND_RUNTIME, tid=tid, corr=corr)


def analyse(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table = S.conform(pa.Table.from_pylist(events), S.RAW_SCHEMA)
    normalized = normalize(table, builtin_rules("pytorch"), RankMeta("t", 0, "pytorch"))
    steps = breakdown(normalized.events).to_pylist()
    for row in steps:
        for key in list(row):
            if key.endswith("_ns"):  # microseconds (host-bound parts: null on CPU timelines)
                row[key.removesuffix("_ns")] = None if row[key] is None else row[key] / 1000
    return steps


def step(n: int, ts: int, dur: int) -> dict[str, Any]:
    return ev(f"ProfilerStep#{n}", ts, dur, kind=S.KIND_ANNOTATION)


def test_cpu_phases_from_ops_regions_and_position() -> None:
    (row,) = analyse(
        [
            step(1, 0, 100),
            ev(
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                0,
                10,
                kind=S.KIND_ANNOTATION,
            ),
            ev("aten::stack", 2, 5),  # inside the data loader: io, not forward
            ev("aten::linear", 10, 20),  # top-level op before backward: forward by position
            ev("aten::addmm", 11, 18),
            ev("autograd::engine::evaluate_function: AddmmBackward0", 35, 30),
            ev("Optimizer.step#SGD.step", 70, 20, kind=S.KIND_ANNOTATION),
            ev("aten::add_", 72, 15),
        ]
    )
    assert row["step"] == 1 and row["wall"] == 100
    assert row["io"] == 10
    assert row["forward"] == 20
    # 30..35 is a gap between forward and backward: different phases, so it is idle
    assert row["backward"] == 30
    # the optimizer region's own time (70..72, 87..90) is region fill: update
    assert row["update"] == 20
    assert row["idle"] == 100 - 10 - 20 - 30 - 20
    assert row["comm_total"] == 0 and row["comm_hidden_fraction"] == 0


def test_gradient_seed_starts_backward_so_a_stall_before_it_is_not_forward() -> None:
    # loss.backward() makes the loss's gradient with ones_like before the autograd engine runs;
    # a rank descheduled as it enters backward leaves a gap after the loss (seen in CI: 8 ms)
    (row,) = analyse(
        [
            step(1, 0, 100),
            ev("aten::linear", 0, 20),
            ev("aten::cross_entropy_loss", 21, 4),  # the loss: top level, forward by position
            ev("aten::ones_like", 40, 2),  # the seed, after a 15 us stall
            ev("aten::empty_like", 40, 1),
            ev("autograd::engine::evaluate_function: AddmmBackward0", 43, 30),
        ]
    )
    assert row["forward"] == 20 + 1 + 4  # the linear, the gap to the loss, the loss
    assert row["backward"] == 2 + 1 + 30  # the seed, the gap after it, the backward op
    assert row["idle"] == 15 + 27  # the stall, and after backward to the step's end


def test_ones_like_inside_the_loss_stays_forward() -> None:
    # a loss that uses ones_like itself: the seed is the last operator before backward only
    (row,) = analyse(
        [
            step(1, 0, 100),
            ev("aten::linear", 0, 20),
            ev("aten::ones_like", 20, 2),
            ev("aten::sub", 22, 3),
            ev("autograd::engine::evaluate_function: SubBackward0", 25, 30),
        ]
    )
    assert row["forward"] == 25 and row["backward"] == 30


def test_wait_on_a_collective_inside_backward_is_communication() -> None:
    (row,) = analyse(
        [
            step(1, 0, 100),
            ev("aten::linear", 0, 20),
            ev("autograd::engine::evaluate_function: AddmmBackward0", 20, 40),
            # the training thread blocks inside a backward op, in a collective
            ev("c10d::allreduce_", 40, 10),
            # the collective itself runs on gloo's thread from 30 to 70
            ev("gloo:all_reduce", 30, 40, kind=S.KIND_ANNOTATION, tid=GLOO),
            ev("Optimizer.step#SGD.step", 80, 10, kind=S.KIND_ANNOTATION),
        ]
    )
    assert row["forward"] == 20
    assert row["backward"] == 30  # 20..40 and 50..60; 40..50 is the wait
    # comm: 40..50 on the training thread (a comm op, even inside backward), 60..70 (the thread
    # is between backward and the optimizer with nothing of its own while gloo runs)
    assert row["comm"] == 20 and row["comm_exposed"] == 20
    assert row["comm_total"] == 40  # 30..70
    assert row["comm_hidden_fraction"] == pytest.approx(0.5)  # 30..40 and 50..60 under backward
    assert row["update"] == 10
    assert row["idle"] == 100 - 20 - 30 - 20 - 10  # 70..80 and 90..100


def test_gap_between_ops_of_one_phase_is_that_phase_unless_comm_runs() -> None:
    rows = analyse(
        [
            step(1, 0, 100),
            ev("autograd::engine::evaluate_function: ReluBackward0", 0, 10),
            ev("autograd::engine::evaluate_function: AddmmBackward0", 20, 10),  # gap 10..20
            ev("autograd::engine::evaluate_function: MmBackward0", 40, 10),  # gap 30..40, comm runs
            ev("gloo:all_reduce", 32, 6, kind=S.KIND_ANNOTATION, tid=GLOO),
            step(2, 100, 50),
        ]
    )
    first = rows[0]
    assert first["backward"] == 30 + 10 + 4  # three ops, the free gap 10..20, and 30..32 + 38..40
    assert first["comm"] == 6 and first["comm_total"] == 6
    assert first["idle"] == 50
    assert [r["step"] for r in rows] == [1, 2]


def test_gpu_kernels_inherit_the_launching_phase_and_nccl_overlaps_backward() -> None:
    events = [
        step(1, 0, 50),
        ev("aten::to", 0, 5),
        ev("aten::copy_", 1, 3),
        launch(2, corr=1),
        ev("aten::linear", 5, 10),
        launch(6, corr=2),
        ev("autograd::engine::evaluate_function: AddmmBackward0", 20, 10, tid=AUTOGRAD),
        launch(21, corr=3, tid=AUTOGRAD),
        ev("nccl:all_reduce", 25, 2, kind=S.KIND_ANNOTATION, tid=AUTOGRAD),
        launch(26, corr=4, tid=AUTOGRAD),
        ev("Optimizer.step#SGD.step", 40, 5, kind=S.KIND_ANNOTATION),
        launch(41, corr=5),
        kernel("Memcpy HtoD (Pageable -> Device)", 10, 10, 1, kind=S.KIND_MEMCPY),
        kernel("volta_sgemm_128x64_nn", 20, 20, 2),  # forward on the device: 20..40
        kernel("volta_sgemm_128x64_nt", 40, 30, 3),  # backward: 40..70
        kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 50, 30, 4, stream=COMM_STREAM
        ),
        kernel("multi_tensor_apply_kernel", 80, 10, 5),  # update: 80..90
    ]
    (row,) = analyse(events)
    # the device runs behind the host: the step window stretches to the last kernel
    assert row["start"] == 0 and row["end"] == 90
    # 0..10 the device has nothing to do while the host copies the batch (aten::to, h2d: its
    # only device work is the copy) and then launches the forward (aten::linear): host-bound
    # time of those two phases, recorded apart from their device time
    assert row["h2d"] == 10 + 5 and row["host_bound_h2d"] == 5
    assert row["forward"] == 20 + 5 and row["host_bound_forward"] == 5
    assert row["backward"] == 30 and row["host_bound_backward"] == 0
    assert row["update"] == 10 and row["host_bound_update"] == 0
    # NCCL 50..80 overlaps backward 50..70; 70..80 is exposed. The host-side nccl:all_reduce
    # call (25..27) is communication too, hidden under the forward kernel.
    assert row["comm_total"] == 32
    assert row["comm"] == 10
    assert row["comm_hidden_fraction"] == pytest.approx(1 - 10 / 32)
    assert row["idle"] == 0
    assert row["timeline"] == S.DEVICE_GPU


def test_trace_without_step_markers_is_one_window() -> None:
    (row,) = analyse(
        [ev("aten::linear", 10, 20), ev("autograd::engine::evaluate_function: MmBackward0", 40, 10)]
    )
    assert row["step"] is None
    assert (row["start"], row["end"]) == (10, 50)
    assert row["forward"] == 20 and row["backward"] == 10 and row["idle"] == 10


def test_timeline_segments_add_up_to_the_breakdown(tmp_path) -> None:
    """The timeline view's per-instant phases are the breakdown, instant by instant."""
    from pathlib import Path

    from tests.conftest import SAMPLES, analysed
    from traceview.analysis.lanes import step_lanes
    from traceview.runs import ingest_run
    from traceview.store import rundir as R

    for name in ("ddp", "gpu_sync"):
        run = ingest_run([SAMPLES / "pytorch" / name], Path(tmp_path) / name)
        steps = analysed(run).steps.to_pylist()
        events = R.read_events(run, [0])
        for row in (r for r in steps if r[S.RANK] == 0):
            start, end, lanes = step_lanes(events, row[S.STEP])
            assert (start, end) == (row[S.START_NS], row[S.END_NS])
            critical = lanes[0]
            totals: dict[str, int] = {}
            for s, e, p in zip(critical.starts, critical.ends, critical.phases, strict=True):
                totals[p] = totals.get(p, 0) + int(e - s)
            for phase in S.BREAKDOWN_PHASES:
                assert totals.get(phase, 0) == row[S.phase_ns(phase)], (name, row[S.STEP], phase)


def test_the_device_waiting_for_a_launch_is_launch_time() -> None:
    """The device idles while the host is inside aten::linear (host-bound forward); while the
    host is inside the cudaLaunchKernel that launches the kernel (6..9) the device waits for
    the launch itself: a ``launch`` segment. A synchronize inside the operator (2..4) is not a
    launch. The kernel then runs 10..30."""
    from traceview.analysis.attribution import timeline_segments

    events = [
        step(1, 0, 30),
        ev("aten::linear", 0, 10),
        ev("cudaStreamSynchronize", 2, 2, kind=S.KIND_RUNTIME),
        ev("cudaLaunchKernel", 6, 3, kind=S.KIND_RUNTIME, corr=1),
        kernel("volta_sgemm_128x64_nn", 10, 20, 1),
    ]
    table = S.conform(pa.Table.from_pylist(events), S.RAW_SCHEMA)
    normalized = normalize(table, builtin_rules("pytorch"), RankMeta("t", 0, "pytorch"))
    got = [
        (r[S.START_NS] // 1000, r[S.END_NS] // 1000, r[S.PHASE], r[S.KIND], r[S.OP])
        for r in timeline_segments(normalized.events).to_pylist()
    ]
    assert got == [
        (0, 6, S.FORWARD, S.SEGMENT_HOST_BOUND, "fully_connected"),
        (6, 9, S.FORWARD, S.SEGMENT_LAUNCH, "fully_connected"),
        (9, 10, S.FORWARD, S.SEGMENT_HOST_BOUND, "fully_connected"),
        (10, 30, S.FORWARD, S.SEGMENT_KERNEL, "fully_connected"),
    ]
