"""Synthetic view models for the TUI's appearance tests: a run report written by hand, so a
change of the analysis does not show up as snapshot diffs, and every case a screen must draw
(a significant straggler, warm-up and slow steps, hostile names, long tables) is there."""

from __future__ import annotations

from typing import Any

from tests.tui_helpers import EVIL
from traceview.model.results import (
    Breakdown,
    ComparedOp,
    ComparedPhase,
    ComparedRun,
    Comparison,
    RankSummary,
    RunInfo,
    RunReport,
    StepStats,
    StepSummary,
    Summary,
    TopOp,
)
from traceview.tui.model import RunView

PHASES = ("io", "h2d", "forward", "backward", "update", "comm", "other", "idle")


def _breakdown(
    io: float, fwd: float, bwd: float, upd: float, comm: float, idle: float
) -> Breakdown:
    return Breakdown(io=io, forward=fwd, backward=bwd, update=upd, comm=comm, idle=idle)


def _rank(rank: int, fwd: float, comm: float, straggler: bool, imbalance: float) -> RankSummary:
    b = _breakdown(2.0, fwd, 20.0, 1.5, comm, 0.5)
    step = b.total()
    busy = step - comm - 0.5
    return RankSummary(
        rank=rank, steps=6, step_ms=step, breakdown_ms=b, comm_total_ms=comm + 8.0,
        comm_exposed_ms=comm, comm_hidden_fraction=round(8.0 / (comm + 8.0), 4), busy_ms=busy,
        bottleneck="backward", timeline="cpu", blocked_ms=comm + 0.5, imbalance=imbalance,
        straggler=straggler,
    )  # fmt: skip


def straggler_report() -> RunReport:
    """Four ranks; rank 2's forward takes three times the others', the others wait in comm."""
    ranks = [
        _rank(0, 10.0, 22.0, False, 0.0),
        _rank(1, 10.2, 21.8, False, 0.0059),
        _rank(2, 30.0, 2.0, True, 0.5917),
        _rank(3, 9.9, 22.1, False, -0.0029),
    ]
    mean = Breakdown.of(
        {p: round(sum(r.breakdown_ms[p] for r in ranks) / len(ranks), 3) for p in PHASES}
    )
    step = round(mean.total(), 3)
    steps = []
    for i, (wall, mark) in enumerate(
        [(90.0, "warm-up"), (56.0, ""), (55.5, ""), (72.0, "slow"), (56.2, ""), (55.9, "")]
    ):
        steps.append(
            StepSummary(
                step=i + 1, ranks=4, step_ms=wall, min_ms=wall - 0.4, max_ms=wall + 0.3,
                slowest_rank=2, vs_median=round((wall - 56.05) / 56.05, 4),
                breakdown_ms=_breakdown(2.0, 15.0, 20.0, 1.5, wall - 39.0, 0.5),
                mark=mark if i else "warm-up",  # type: ignore[arg-type]
            )
        )  # fmt: skip
    ops = [
        TopOp(op="convolution_backward", name="aten::convolution_backward", device="cpu",
              phase="backward", calls_per_step=12, self_ms_per_step=14.2, total_ms_per_step=18.1,
              p95_ms=1.9, mean_ms=1.5083, share=0.2536),
        TopOp(op="allreduce", name="c10d::allreduce_", device="cpu", phase="comm",
              calls_per_step=4, self_ms_per_step=12.0, total_ms_per_step=12.4, p95_ms=6.1,
              mean_ms=3.1, share=0.2143),
        TopOp(op="convolution", name="aten::conv2d", device="cpu", phase="forward",
              calls_per_step=12, self_ms_per_step=9.8, total_ms_per_step=11.0, p95_ms=1.2,
              mean_ms=0.9167, share=0.175),
        TopOp(op=f"matmul{EVIL}", name=f"aten::mm{EVIL}", device="cpu", phase="backward",
              calls_per_step=7, self_ms_per_step=3.3, total_ms_per_step=3.3, p95_ms=0.6,
              mean_ms=0.4714, share=0.0589),
        TopOp(op="data_loader", name="enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
              device="cpu", phase="io", calls_per_step=1, self_ms_per_step=2.0,
              total_ms_per_step=2.0, p95_ms=2.4, mean_ms=2.0, share=0.0357),
    ]  # fmt: skip
    return RunReport(
        run=RunInfo(framework="pytorch", ranks=4, steps=6, world_size=4, missing_ranks=[],
                    timeline="cpu", path=None, run_id=None, job=None),
        summary=Summary(
            breakdown_ms=mean, step_ms=step, comm_total_ms=25.0, comm_exposed_ms=mean.comm,
            comm_hidden_fraction=0.3, hidden="partly", bottleneck="backward",
            bottleneck_share=round(mean.backward / step, 4), straggler_rank=2,
            straggler_excess=0.5917, straggler_significant=True, blocked_ms=mean.comm + 0.5,
        ),
        ranks=ranks,
        per_step=steps,
        step_stats=StepStats(count=6, mean_ms=64.27, median_ms=56.1, stdev_ms=13.6,
                             min_ms=55.5, max_ms=90.0, cv=0.2116, warmup_factor=1.1,
                             slow_factor=1.25),
        top_ops=ops,
        warnings=[f"rank 3 ended: killed{EVIL}"],
        remarks=["ranks taken from the file names (the traces do not state them)"],
    )  # fmt: skip


def straggler_view() -> RunView:
    return RunView(label="straggler", report=straggler_report(), windows={})


def comparison() -> Comparison:
    a, b = straggler_report(), straggler_report()
    runs = [
        ComparedRun(label=label, framework="pytorch", ranks=4, steps=6, timeline="cpu",
                    step_ms=step, step_ratio=ratio, breakdown_ms=r.summary.breakdown_ms,
                    comm_total_ms=25.0, comm_hidden_fraction=hidden, hidden="partly",
                    bottleneck=bottleneck)
        for label, step, ratio, hidden, r, bottleneck in [
            ("gloo", 56.0, 1.0, 0.3, a, "backward"),
            (f"nccl{EVIL}", 40.0, 0.714, 0.8, b, "comm"),
        ]
    ]  # fmt: skip
    phases = [
        ComparedPhase(phase=p, ms=[v, v * f], ratio=[1.0 if v else None, f if v else None])
        for p, v, f in [
            ("io", 2.0, 1.0), ("h2d", 0.0, 1.0), ("forward", 15.0, 0.5), ("backward", 20.0, 0.6),
            ("update", 1.5, 1.0), ("comm", 17.0, 0.2), ("other", 0.0, 1.0), ("idle", 0.5, 2.0),
        ]
    ]  # fmt: skip
    ops = [
        ComparedOp(op="convolution_backward", ms=[18.1, 9.0], ratio=[1.0, 0.497]),
        ComparedOp(op="allreduce", ms=[12.4, 0.0], ratio=[1.0, 0.0]),
        ComparedOp(op=f"only_in_b{EVIL}", ms=[0.0, 3.0], ratio=[None, None]),
    ]
    return Comparison(
        runs=runs,
        phases=phases,
        ops=ops,
        highlights=[
            f"nccl{EVIL}'s step takes 0.71× gloo's",
            "gloo's exposed comm takes 5.0× nccl's",
        ],
    )


def _kernels(phase: str, op: str | None, n: float, dur: float, latency: float, short: float):  # type: ignore[no-untyped-def]
    from traceview.model.results import KernelLaunches

    return KernelLaunches(
        phase=phase, op=op, kernels_per_step=n, launch_latency_us_p50=latency,
        launch_latency_us_p95=latency * 2.5, kernel_us_p50=dur, kernel_us_p95=dur * 3,
        launch_overhead_us_p50=4.2, short_kernel_fraction=short,
        launch_queue_us_p50=latency * 40, launch_queue_us_p95=latency * 90, queued_fraction=0.97,
    )  # type: ignore[arg-type]  # fmt: skip


def gpu_view() -> RunView:
    """The straggler run as if rank 0 ran on a GPU: its kernel launches per operator and
    phase (hostile and unknown operator names among them)."""
    import msgspec

    from traceview.model.results import GpuIdle, GpuPhase, HostBound, RankGpu

    report = straggler_report()
    kernels = [
        _kernels("backward", "convolution_backward", 82, 90.0, 8573, 0.06),
        _kernels("forward", "convolution", 24, 112.0, 4138, 0.0),
        _kernels("update", "weights_update", 31, 1.9, 1210, 1.0),
        _kernels("backward", f"matmul{EVIL}", 7, 14.5, 950, 0.43),
        _kernels("h2d", "to", 2, 1860.0, 35, 0.0),
        _kernels("other", None, 1, 2.1, 12, 1.0),
    ]
    gpu = RankGpu(
        busy_fraction=0.56, busy_ms=31.4, idle_ms=GpuIdle(host_bound=3.6, data=2.0, other=1.3),
        sync_ms=12.0, launches=147, launch_latency_us_p50=5132, launch_latency_us_p95=15396,
        short_kernel_fraction=0.17, kernel_us_p50=9.8, kernel_us_p95=410.0,
        launch_queue_us_p50=205280, launch_queue_us_p95=615840, launch_queued_fraction=0.97,
        phases=[GpuPhase(phase="forward", device_ms=9.0, host_bound_ms=1.0, total_ms=10.0)],
        kernels=kernels,
    )  # fmt: skip
    bound = HostBound(h2d=0.5, forward=1.0, backward=1.6, update=0.5)
    ranks = [msgspec.structs.replace(report.ranks[0], gpu=gpu, host_bound_ms=bound)]
    report = msgspec.structs.replace(report, ranks=ranks + report.ranks[1:])
    return RunView(label="gpu", report=report, windows={})


def mesh_report() -> RunReport:
    """The straggler run as a 2-D mesh: dp groups {0, 2} and {1, 3}, tp groups {0, 1} and
    {2, 3}, and the world; its communication by group and phase (FSDP all-gathers in forward,
    reduce-scatters in backward over dp, tensor-parallel all-reduces in both over tp)."""
    import msgspec

    from traceview.model.results import CommByGroup, ProcessGroup

    groups = [
        ProcessGroup(name="0", desc="default_pg", dim=None, ranks=[0, 1, 2, 3]),
        ProcessGroup(name="1", desc="mesh_dp", dim="dp", ranks=[0, 2]),
        ProcessGroup(name="2", desc="mesh_dp", dim="dp", ranks=[1, 3]),
        ProcessGroup(name="3", desc="mesh_tp", dim="tp", ranks=[0, 1]),
        ProcessGroup(name="4", desc="mesh_tp", dim="tp", ranks=[2, 3]),
    ]

    def row(
        group: ProcessGroup, phase: str, op: str, total: float, exposed: float, wait: float
    ) -> CommByGroup:
        return CommByGroup(
            group=group.name, dim=group.dim, ranks=group.ranks, phase=phase, op=op,
            calls_per_step=2.0, bytes_per_step=1 << 20, total_ms=total, exposed_ms=exposed,
            hidden_ms=round(total - exposed, 3), wait_ms=wait, transfer_ms=round(total - wait, 3),
        )  # fmt: skip

    comm = [
        row(groups[1], "forward", "allgather", 12.1, 2.4, 1.0),
        row(groups[1], "backward", "reduce_scatter", 6.3, 2.5, 0.5),
        row(groups[2], "forward", "allgather", 11.8, 2.2, 0.9),
        row(groups[2], "backward", "reduce_scatter", 6.1, 2.6, 0.4),
        row(groups[3], "forward", "allreduce", 3.0, 3.0, 2.1),
        row(groups[4], "forward", "allreduce", 3.2, 3.2, 0.2),
    ]
    return msgspec.structs.replace(straggler_report(), groups=groups, comm_by_group=comm)


def mesh_view() -> RunView:
    return RunView(label="mesh2d", report=mesh_report(), windows={})


#: The synthetic pipeline: 2 stages, GPipe, 4 micro-batches; stage 1's forward 3x stage 0's.
PIPELINE_STEP_NS = 100_000_000


def pipeline_report() -> RunReport:
    import msgspec

    from traceview.model.results import Pipeline, PipelineStage, ProcessGroup

    report = straggler_report()
    ranks = [
        msgspec.structs.replace(r, rank=i, straggler=i == 1) for i, r in enumerate(report.ranks[:2])
    ]
    pipeline = Pipeline(
        stages=[
            PipelineStage(stage=0, ranks=[0], compute_ms=32.0, bubble_ms=68.0, transfer_ms=0.4),
            PipelineStage(stage=1, ranks=[1], compute_ms=80.0, bubble_ms=20.0, transfer_ms=0.4),
        ],
        microbatches=4.0, schedule="GPipe", bubble_fraction=0.44, ideal_bubble_fraction=0.2,
        slowest_stage=1, slowest_phase="forward", slowest_phase_ratio=3.0,
    )  # fmt: skip
    summary = msgspec.structs.replace(
        report.summary, bottleneck="pipeline", straggler_rank=1, bottleneck_share=0.44
    )
    groups = [ProcessGroup(name="0", desc="default_pg", dim=None, ranks=[0, 1])]
    steps = [msgspec.structs.replace(s, ranks=2, slowest_rank=1) for s in report.per_step[:3]]
    return msgspec.structs.replace(
        report, ranks=ranks, summary=summary, pipeline=pipeline, groups=groups, per_step=steps,
        run=msgspec.structs.replace(report.run, ranks=2, world_size=2, steps=3),
    )  # fmt: skip


def pipeline_lanes() -> dict[tuple[int, int | None], Any]:
    """Each stage's every-instant lane in each step of ``pipeline_report``, written by hand:
    GPipe's four forwards (stage 1's three times as long), then four backwards; between them
    each stage waits for the other (comm: blocked in recv), then the update."""
    import numpy as np

    from traceview.analysis.lanes import Lane, RankLanes

    ms = 1_000_000
    out: dict[tuple[int, int | None], Any] = {}
    for step in (1, 2, 3):
        base = step * PIPELINE_STEP_NS
        spans: dict[int, list[tuple[int, int, str]]] = {0: [], 1: []}
        t0 = t1 = 0
        for _ in range(4):  # forwards: stage 0 2 ms each, stage 1 6 ms after it
            spans[0].append((t0, t0 + 2, "forward"))
            t1 = max(t1, t0 + 2)
            spans[1].append((t1, t1 + 6, "forward"))
            t0, t1 = t0 + 2, t1 + 6
        for _ in range(4):  # backwards: stage 1 4 ms each, stage 0 2 ms after it
            spans[1].append((t1, t1 + 4, "backward"))
            t0 = max(t0, t1 + 4)
            spans[0].append((t0, t0 + 2, "backward"))
            t1, t0 = t1 + 4, t0 + 2
        for stage in (0, 1):
            filled: list[tuple[int, int, str]] = []
            at = 0
            for s, e, phase in spans[stage]:
                if s > at:
                    filled.append((at, s, "comm"))
                filled.append((s, e, phase))
                at = e
            filled.append((at, max(t0, t1), "comm"))
            filled.append((max(t0, t1), max(t0, t1) + 2, "update"))
            lane = Lane(
                rank=stage,
                label=f"rank {stage} · every instant",
                starts=np.array([base + s * ms for s, _, _ in filled], dtype=np.int64),
                ends=np.array([base + e * ms for _, e, _ in filled], dtype=np.int64),
                phases=[p for _, _, p in filled],
            )
            end = base + (max(t0, t1) + 2) * ms
            out[(stage, step)] = RankLanes(stage, step, base, end, [lane])
    return out


def pipeline_view() -> RunView:
    lanes = pipeline_lanes()
    windows: dict[int | None, dict[int, tuple[int, int]]] = {}
    for (rank, step), found in lanes.items():
        windows.setdefault(step, {})[rank] = (found.start_ns, found.end_ns)
    return RunView(label="gpipe2", report=pipeline_report(), windows=windows)
