"""Synthetic view models for the TUI's appearance tests: a run report written by hand, so a
change of the analysis does not show up as snapshot diffs, and every case a screen must draw
(a significant straggler, warm-up and slow steps, hostile names, long tables) is there."""

from __future__ import annotations

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
