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
from collections.abc import Iterable

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.attribution import CommSchedule, comm_schedule, layerwise_exposed
from traceview.analysis.crossrank import BUS_FACTOR
from traceview.model import schema as S
from traceview.model.manifest import Manifest
from traceview.model.results import (
    AllReduceRate,
    Breakdown,
    CollectiveFit,
    Extrapolation,
    ExtrapolationCheck,
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


#: Ranks whose collectives the overlap model replays (their pattern repeats across ranks).
REPLAY_RANKS = 4


def sample_ranks(manifest: Manifest) -> list[int]:
    """Up to REPLAY_RANKS ranks spread over the run."""
    ranks = sorted(manifest.ranks_present or [r.rank for r in manifest.ranks])
    if len(ranks) <= REPLAY_RANKS:
        return ranks
    picks = {round(i * (len(ranks) - 1) / (REPLAY_RANKS - 1)) for i in range(REPLAY_RANKS)}
    return [ranks[i] for i in sorted(picks)]


def counted_schedules(report: RunReport, events: Iterable[pa.Table]) -> list[CommSchedule]:
    """The collectives the layer-wise model replays (``comm_schedule``) of each rank's
    ``events`` (``sample_ranks``), in the steps every rank completed and the report counts:
    warm-up steps and those --steps/--skip left out are not these."""
    left_out = {u.step for u in report.incomplete_steps} | {
        s.step for s in report.per_step if s.excluded is not None
    }
    return [s for rank in events for s in comm_schedule(rank) if s.step not in left_out]


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
    fitted = fit_collectives(reports)
    check = check_extrapolation(reports)
    if check is not None:
        notes.append(
            f"ranks never run: the collective model fitted on {', '.join(map(str, check.fitted_on))}"
            f" ranks predicts {check.ranks}: communication {pct_text(check.comm_error)} off, the step"
            f" {pct_text(check.step_error)} (it keeps the compute of the run it starts from)"
        )
    return Scaling(
        collective_model=fitted,
        extrapolated=extrapolate(reports, fitted, n0, t0),
        extrapolation_check=check,
        base=ScalingBase(label=labels[0], ranks=n0, step_ms=t0, breakdown_ms=base),
        runs=runs,
        models={m: ModelFit(mean_error=fits[m]) for m in MODELS},
        best_model=best,
        batch_size=batch_size,
        link_gbps=link_gbps,
        notes=notes,
    )


# --- ranks never run -------------------------------------------------------------------------


def _bus(op: str, n: int) -> float:
    return BUS_FACTOR[op](n) if op in BUS_FACTOR else 1.0


def pct_text(value: float) -> str:
    return f"{value:.0%}"


def fit_collectives(reports: list[RunReport]) -> list[CollectiveFit]:
    """Per collective, latency and bandwidth fitted by least squares on the matched calls of the
    runs of more than one rank: transfer = latency x (n - 1) + bus bytes / bandwidth."""
    rows: dict[str, list[tuple[float, float, float, int]]] = {}
    for report in reports:
        n = report.run.ranks
        if n < 2:
            continue
        for c in report.collectives:
            if c.op in ("send", "recv") or c.calls_per_step <= 0:
                continue
            size = float(c.bytes) * _bus(c.op, n) if c.bytes is not None else 0.0
            rows.setdefault(c.op, []).append((float(n - 1), size, c.transfer_ms, n))
    out = []
    for op, data in sorted(rows.items()):
        x = np.array([[a, b] for a, b, _, _ in data])
        y = np.array([t for _, _, t, _ in data])
        if (x[:, 1] > 0).any() and len(data) >= 2:
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            latency, per_byte = float(coef[0]), float(coef[1])
            if latency < 0 or per_byte <= 0:  # no latency to be seen: bandwidth alone
                latency = 0.0
                per_byte = float(x[:, 1] @ y / (x[:, 1] @ x[:, 1]))
        else:  # no sizes: all of it latency
            latency, per_byte = float(y.mean() / x[:, 0].mean()), 0.0
        out.append(
            CollectiveFit(
                op=op,
                latency_ms=round(latency, 4),
                busbw_gbps=round(8 / (per_byte * 1e6), 3) if per_byte > 0 else None,
                calls=len(data),
                runs=sorted({n for *_, n in data}),
            )
        )
    return out


def _comm_at(report: RunReport, fits: list[CollectiveFit], n: int) -> float | None:
    """Transfer per step at ``n`` ranks of ``report``'s collectives (their sizes and calls per
    step as in that run), by the fitted model; None where an op was not fitted."""
    model = {f.op: f for f in fits}
    total = 0.0
    for c in report.collectives:
        if c.op in ("send", "recv"):
            continue
        fit = model.get(c.op)
        if fit is None:
            return None
        size = float(c.bytes or 0) * _bus(c.op, n)
        per_byte = 8 / (fit.busbw_gbps * 1e6) if fit.busbw_gbps else 0.0
        total += c.calls_per_step * (fit.latency_ms * (n - 1) + size * per_byte)
    return total


def _step_at(report: RunReport, comm_then: float, comm_now: float) -> float:
    """The step of ``report`` with its communication grown from ``comm_now`` to ``comm_then``,
    at the run's share of communication exposed."""
    s = report.summary
    exposed = s.comm_exposed_ms / s.comm_total_ms if s.comm_total_ms > 0 else 1.0
    return s.step_ms + (comm_then - comm_now) * exposed


def extrapolate(
    reports: list[RunReport], fits: list[CollectiveFit], n0: int, t0: float
) -> list[Extrapolation]:
    """The step at 2x and 4x the largest run's ranks."""
    largest = max(reports, key=lambda r: r.run.ranks)
    n = largest.run.ranks
    if n < 2 or not fits or not largest.collectives:
        return []
    now = _comm_at(largest, fits, n)
    out = []
    for ranks in (2 * n, 4 * n):
        then = _comm_at(largest, fits, ranks)
        if now is None or then is None:
            return []
        step = _step_at(largest, then, now)
        out.append(
            Extrapolation(
                ranks=ranks,
                comm_ms=round(then, 3),
                step_ms=round(step, 3),
                speedup=round(ranks * t0 / (n0 * step), 3) if step > 0 else None,
            )
        )
    return out


def check_extrapolation(reports: list[RunReport]) -> ExtrapolationCheck | None:
    """Fit without the largest run, predict it from the next largest: the model's error."""
    ordered = sorted(reports, key=lambda r: r.run.ranks)
    multi = [r for r in ordered if r.run.ranks > 1]
    if len(multi) < 2:
        return None
    target, start = multi[-1], multi[-2]
    fits = fit_collectives(ordered[:-1])
    now = _comm_at(start, fits, start.run.ranks)
    then = _comm_at(start, fits, target.run.ranks)
    # measured as the model counts it: each call's transfer, per step (calls that overlap in
    # time counted each)
    measured = sum(
        c.calls_per_step * c.transfer_ms for c in target.collectives if c.op not in ("send", "recv")
    )
    if now is None or then is None or not target.collectives or not fits:
        return None
    step = _step_at(start, then, now)
    t = target.summary.step_ms
    return ExtrapolationCheck(
        fitted_on=sorted({r.run.ranks for r in ordered[:-1] if r.run.ranks > 1}),
        ranks=target.run.ranks,
        predicted_comm_ms=round(then, 3),
        measured_comm_ms=round(measured, 3),
        comm_error=round(abs(then - measured) / measured, 4) if measured > 0 else 0.0,
        predicted_step_ms=round(step, 3),
        measured_step_ms=t,
        step_error=round(abs(step - t) / t, 4) if t > 0 else 0.0,
    )
