"""Scaling: measured throughput and speedup of runs with 1..N workers, against the performance model.

Weak scaling, as in the synchronous-SGD studies this tool grows out of: every worker processes
its own mini-batch, so N workers do N times the work per step. With t(N) the step time on N
workers and N0 the smallest run,

    speedup S(N) = N * t(N0) / t(N)        efficiency = S(N) / N

(S(1) = 1 when the smallest run has one worker). The model predicts t(N) from the smallest
run's breakdown (io, compute = h2d + forward + backward + update, the rest = other + idle) and
each run's own measured communication t_comm(N):

    sequential   t = io + compute + rest + t_comm(N)
    pipelined    t = max(compute + rest + t_comm(N), io)            (data loading prefetched)
    overlapped   t = io + compute + rest + exposed(N)
                 layer-wise pipelining (wait-free backpropagation): run N's collectives, each
                 issued when the share of backward that it was issued after in run N is done on
                 the smallest run's backward, one after another, with run N's comm time; only
                 what runs past the end of backward is exposed. Without collectives to replay,
                 exposed = max(0, t_comm(N) - backward).

and says which model fits the measurements best. Where collectives were matched across ranks,
t_comm(N) is the transfer only: the time a rank spent in a collective waiting for the last rank
to arrive is imbalance, not communication that grows with N: each prediction adds run N's
measured exposed wait as it is (``comm_wait_ms``; the what-if ``balanced`` takes it out). The same models on each run's own breakdown
("predicted_own_compute") separate the communication model's error from compute that grew with N
(ranks sharing cores, memory bandwidth or a PCIe switch). What-ifs take each run's own breakdown.
"""

from __future__ import annotations

from collections import Counter

import polars as pl
import pyarrow as pa

from traceview.analysis.attribution import CommSchedule, layerwise_exposed
from traceview.model import schema as S
from traceview.model.manifest import Manifest
from traceview.model.results import (
    AllReduceRate,
    Breakdown,
    ModelFit,
    OwnPrediction,
    Prediction,
    RunReport,
    ScaledRun,
    Scaling,
    ScalingBase,
)

MODELS = ("sequential", "pipelined", "overlapped")


def predict(
    model: str, base: Breakdown, comm_ms: float, schedules: list[CommSchedule] | None = None
) -> float:
    io = base[S.IO]
    compute = compute_ms(base)
    rest = base[S.OTHER] + base[S.IDLE]
    if model == "sequential":
        return io + compute + rest + comm_ms
    if model == "pipelined":
        return max(compute + rest + comm_ms, io)
    if model == "overlapped":
        if schedules:
            exposed = sum(layerwise_exposed(s, base[S.BACKWARD], comm_ms) for s in schedules)
            return io + compute + rest + exposed / len(schedules)
        return io + compute + rest + max(0.0, comm_ms - base[S.BACKWARD])
    raise ValueError(f"unknown model {model!r}")


def allreduce_bytes(ops: pa.Table, report: RunReport) -> float | None:
    """Bytes all-reduced per step and rank, where the trace tells message sizes."""
    df = pl.from_arrow(ops)
    assert isinstance(df, pl.DataFrame)
    df = df.filter((pl.col(S.OP) == "allreduce") & pl.col(S.BYTES).is_not_null())
    if df.height == 0:
        return None
    # one collective can be seen by several events (c10d::allreduce_, gloo:all_reduce, an NCCL
    # kernel): take the view that saw the most bytes
    per_view = df.group_by(S.DEVICE, S.NAME).agg(pl.col(S.BYTES).sum())
    most = per_view[S.BYTES].max()
    total = float(most) if isinstance(most, int | float) else 0.0
    steps = sum(r.steps for r in report.ranks) or 1
    return total / steps if total else None


def compute_ms(breakdown: Breakdown) -> float:
    return breakdown[S.H2D] + breakdown[S.FORWARD] + breakdown[S.BACKWARD] + breakdown[S.UPDATE]


def traced_batch_size(manifest: Manifest) -> int | None:
    """The per-rank mini-batch the parsers read off the traces' input shapes (most ranks' value)."""
    sizes = [r.meta.get("batch_size") for r in manifest.ranks]
    counts = Counter(s for s in sizes if isinstance(s, int) and s > 0)
    return counts.most_common(1)[0][0] if counts else None


def what_if(
    step_ms: float,
    breakdown: Breakdown,
    comm_total: float,
    comm_exposed: float,
    k: float,
    wait_exposed: float | None = None,
) -> dict[str, float]:
    """Step times if communication were hidden, data loading hidden, communication ``k`` times
    faster (its transfer: waiting for a rank does not get faster with the network), and where
    the exposed wait is known, the ranks balanced (no one waits for a straggler)."""
    wait = wait_exposed or 0.0
    transfer_total, transfer_exposed = comm_total - wait, comm_exposed - wait
    hidden = transfer_total - transfer_exposed
    faster = max(0.0, transfer_total / k - hidden)  # what stays hidden stays hidden
    scenarios = {
        "comm_hidden_ms": round(step_ms - comm_exposed, 3),
        "io_hidden_ms": round(step_ms - breakdown[S.IO], 3),
        f"comm_{k:g}x_faster_ms": round(step_ms - transfer_exposed + faster, 3),
    }
    if wait_exposed is not None:
        scenarios["balanced_ms"] = round(step_ms - wait, 3)
    return scenarios


def partial_run(report: RunReport) -> str | None:
    """How a run holds fewer ranks than its job had (None: it holds them all). Such a run is
    part of a larger job, not a smaller one: its step time is the large job's."""
    world = report.run.world_size
    if world is None or report.run.ranks >= world:
        return None
    return f"holds {report.run.ranks} of its job's {world} ranks"


def scaling(
    reports: list[RunReport],
    ops: list[pa.Table],
    labels: list[str],
    *,
    batch_size: int | None = None,
    traced_batch_sizes: list[int | None] | None = None,
    schedules: list[list[CommSchedule]] | None = None,
    link_gbps: float | None = None,
    faster_comm: float = 2.0,
) -> Scaling:
    """The scaling analysis of several runs of one job with different rank counts.

    ``batch_size`` (the user's) wins over ``traced_batch_sizes`` (read off each run's traces);
    ``schedules``: each run's collectives as analysis.attribution.comm_schedule reads them.
    """
    order = sorted(range(len(reports)), key=lambda i: reports[i].run.ranks)
    reports = [reports[i] for i in order]
    ops = [ops[i] for i in order]
    labels = [labels[i] for i in order]
    traced = [(traced_batch_sizes or [None] * len(order))[i] for i in order]
    replays = [(schedules or [[]] * len(order))[i] for i in order]
    base_report = reports[0]
    n0 = base_report.run.ranks
    t0 = base_report.summary.step_ms
    base = base_report.summary.breakdown_ms
    runs = []
    errors: dict[str, list[float]] = {m: [] for m in MODELS}
    base_compute = compute_ms(base)
    notes = [
        f"{label}: {partial} (--allow-partial): taken as a run of {report.run.ranks}"
        for label, report in zip(labels, reports, strict=True)
        if (partial := partial_run(report))
    ]
    for label, report, table, guess, replay in zip(
        labels, reports, ops, traced, replays, strict=True
    ):
        summary = report.summary
        n = report.run.ranks
        t = summary.step_ms
        # the communication that grows with N: the transfer, where waits were measured
        comm = (
            summary.comm_transfer_total_ms
            if summary.comm_transfer_total_ms is not None
            else summary.comm_total_ms
        )
        batch = batch_size or guess
        predicted: dict[str, Prediction] = {}
        own_compute: dict[str, OwnPrediction] = {}
        imbalance = summary.comm_wait_ms or 0.0  # measured, not modelled
        for model in MODELS:
            value = predict(model, base, comm, replay) + imbalance
            error = abs(value - t) / t if t > 0 else None
            predicted[model] = Prediction(
                step_ms=round(value, 3),
                speedup=round(n * t0 / value, 3) if value > 0 else None,
                error=round(error, 4) if error is not None else None,
            )
            if n > n0 and error is not None:
                errors[model].append(error)
            # the same model on this run's own io and compute: the communication model alone
            own = predict(model, summary.breakdown_ms, comm, replay) + imbalance
            own_compute[model] = OwnPrediction(
                step_ms=round(own, 3), error=round(abs(own - t) / t, 4) if t > 0 else None
            )
        scenarios: dict[str, float | None] = dict(
            what_if(
                t,
                summary.breakdown_ms,
                summary.comm_total_ms,
                summary.comm_exposed_ms,
                faster_comm,
                summary.comm_wait_ms,
            )
        )
        for key, ms in list(scenarios.items()):
            scenarios[key.replace("_ms", "_speedup")] = (
                round(n * t0 / ms, 3) if ms is not None and ms > 0 else None
            )
        allreduce = None
        if link_gbps:
            per_step = allreduce_bytes(table, report)
            if per_step and comm > 0 and n > 1:
                algbw = per_step / (comm / 1e3)  # bytes/s as the application sees it
                busbw = algbw * 2 * (n - 1) / n  # what a ring moves over each link
                allreduce = AllReduceRate(
                    bytes_per_step=int(per_step),
                    algbw_gbps=round(algbw * 8 / 1e9, 3),
                    busbw_gbps=round(busbw * 8 / 1e9, 3),
                    # gradient bytes / (t_comm x bandwidth), and what a ring achieves per link
                    efficiency=round(algbw * 8 / 1e9 / link_gbps, 4),
                    bus_efficiency=round(busbw * 8 / 1e9 / link_gbps, 4),
                )
        entry = ScaledRun(
            label=label,
            ranks=n,
            step_ms=t,
            speedup=round(n * t0 / t, 3) if t > 0 else None,
            efficiency=round(t0 / t, 3) if t > 0 else None,
            batch_size=batch,
            batch_size_from="user" if batch_size else "input shapes" if guess else None,
            samples_per_s=round(n * batch / (t / 1e3), 1) if batch and t > 0 else None,
            compute_ratio=round(compute_ms(summary.breakdown_ms) / base_compute, 3)
            if base_compute > 0
            else None,
            comm_total_ms=summary.comm_total_ms,
            comm_exposed_ms=summary.comm_exposed_ms,
            comm_model_ms=comm,
            comm_wait_ms=summary.comm_wait_ms,
            comm_hidden_fraction=summary.comm_hidden_fraction,
            breakdown_ms=summary.breakdown_ms,
            predicted=predicted,
            predicted_own_compute=own_compute,
            what_if=scenarios,
            allreduce=allreduce,
        )
        runs.append(entry)
        if comm > 0 and not replay:
            notes.append(
                f"{label}: no collectives to replay; the overlapped model lets the whole backward hide"
                " communication"
            )
        if batch is None:
            notes.append(
                f"{label}: no batch size in the trace's input shapes; give --batch-size for samples/s"
            )
    slow = [r for r in runs[1:] if (r.compute_ratio or 0) > 1.2]
    if slow:
        worst = max(slow, key=lambda r: r.compute_ratio or 0)
        notes.append(
            f"compute per step grows to ×{worst.compute_ratio or 0:.2f} at {worst.ranks} ranks: the model"
            " assumes it stays as in the smallest run (ranks sharing cores or memory bandwidth break that)"
        )
    fits = {m: round(sum(e) / len(e), 4) if e else None for m, e in errors.items()}
    ranked = [m for m in MODELS if fits[m] is not None]
    best = min(ranked, key=lambda m: fits[m] or 0.0) if ranked else None
    return Scaling(
        base=ScalingBase(label=labels[0], ranks=n0, step_ms=t0, breakdown_ms=base),
        runs=runs,
        models={m: ModelFit(mean_error=fits[m]) for m in MODELS},
        best_model=best,
        batch_size=batch_size,
        link_gbps=link_gbps,
        notes=notes,
    )
