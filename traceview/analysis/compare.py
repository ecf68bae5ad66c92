"""Runs side by side: step time, phases, communication and canonical operators, with ratios;
for jobs beyond data parallelism, communication by mesh dimension (or group) and phase, and
each run's pipeline (its stages' compute and bubble).

The input is each run's report (analysis.summary) and ops table; the output is a
``results.Comparison`` (``traceview compare --json``), which the text report and the TUI render. Operators are
compared by canonical name (convolution, convolution_backward, batch_norm, fully_connected,
allreduce ...), so runs of different frameworks line up. On GPU runs an operator's time is the
device time of the kernels and copies it launched; on CPU runs it is the operator's inclusive time
on the host (a layer's backward includes the matrix products it calls, as the framework's own
profiler tables count it), over operators and regions (data loading, the optimizer step,
collectives on the communication threads).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.cause import cause_brief
from traceview.analysis.ops import in_steps
from traceview.model import schema as S
from traceview.model.results import (
    ComparedCommGroup,
    ComparedOp,
    ComparedPhase,
    ComparedRun,
    ComparedWorker,
    Comparison,
    RunReport,
)
from traceview.model.results.compare import kind_of

#: A ratio is worth a headline when the slower side is this much slower...
NOTABLE_RATIO = 1.5
#: ...and the operator takes at least this share of that run's step...
NOTABLE_SHARE = 0.02
#: ...or, for a phase, this share.
NOTABLE_PHASE_SHARE = 0.05
MAX_OP_HIGHLIGHTS = 5
#: Operators compared (the largest by time in any run), for every view of a comparison.
TOP = 15


def _ratio(value: float, base: float) -> float | None:
    return round(value / base, 3) if base > 0 else None


def op_times(ops: pa.Table, report: RunReport) -> dict[str, float]:
    """Milliseconds per counted step (mean over ranks) of each canonical operator of one run."""
    counted = [s.step for s in report.per_step if s.excluded is None and s.step is not None]
    df = pl.from_arrow(in_steps(ops, counted))
    assert isinstance(df, pl.DataFrame)
    if df.height == 0:
        return {}
    device = S.DEVICE_GPU if report.run.timeline == S.DEVICE_GPU else S.DEVICE_CPU
    ranks = max(report.run.ranks, 1)
    steps = max(sum(r.steps for r in report.ranks) / ranks, 1)
    if device == S.DEVICE_GPU:
        df = df.filter((pl.col(S.DEVICE) == device) & pl.col(S.KIND).is_in(S.DEVICE_ACTIVITY_KINDS))
    else:
        df = df.filter(
            (pl.col(S.DEVICE) == device) & pl.col(S.KIND).is_in([S.KIND_OP, S.KIND_ANNOTATION])
        )
    totals = df.group_by(S.OP).agg(pl.col(S.TOTAL_NS).sum())
    return {
        row[S.OP]: round(row[S.TOTAL_NS] / 1e6 / steps / ranks, 4)
        for row in totals.iter_rows(named=True)
    }


def _add_memory(run: ComparedRun, report: RunReport) -> None:
    """The run's memory figures: its highest peak and where (left null where it has none)."""
    memory = report.summary.memory
    if memory is None:
        return
    peak = next((r.memory for r in report.ranks if r.rank == memory.peak_rank), None)
    run.memory_peak_mb = memory.peak_mb
    run.memory_peak_rank = memory.peak_rank
    run.memory_device = memory.device
    if peak is not None:
        run.memory_peak_phase = peak.peak_phase
        run.memory_since_profiling_started = peak.since_profiling_started


def _memory_highlights(runs: list[ComparedRun]) -> list[str]:
    """Which run needs the most memory against the baseline, and in which phase it peaks."""
    base = runs[0]
    out = []
    for run in runs[1:]:
        a, b = base.memory_peak_mb, run.memory_peak_mb
        if not a or not b or max(a, b) / min(a, b) < NOTABLE_RATIO:
            continue
        more, less = (run, base) if b > a else (base, run)
        phase = f", in {more.memory_peak_phase}" if more.memory_peak_phase else ""
        out.append(
            f"{more.label} peaks at {max(a, b) / min(a, b):.1f}× {less.label}'s memory "
            f"({more.memory_peak_mb:.1f} against {less.memory_peak_mb:.1f} MiB{phase})"
        )
    return out


def beyond_data_parallel(report: RunReport) -> bool:
    """Whether the run's communication is of several kinds (a mesh's dimensions, FSDP's gathers
    and reduce-scatters in two phases, a pipeline's pairs): the text report's rule for telling
    it by group and phase."""
    kinds = {(c.phase, c.op) for c in report.comm_by_group}
    return report.pipeline is not None or len(kinds) > 1 or any(c.dim for c in report.comm_by_group)


CommKey = tuple[str | None, str | None, str, str]  # (dim, group outside a mesh, phase, op)


def _comm_of(report: RunReport) -> dict[CommKey, tuple[float, float, float]]:
    """A run's communication by dimension (the mean of its groups) or group, phase and op:
    (total, exposed, wait) ms per step."""
    sums: dict[CommKey, list[float]] = {}
    for c in report.comm_by_group:
        key = (c.dim, None if c.dim else c.group, c.phase, c.op)
        acc = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        acc[0] += c.total_ms
        acc[1] += c.exposed_ms
        acc[2] += c.wait_ms
        acc[3] += 1
    return {k: (t / n, e / n, w / n) for k, (t, e, w, n) in sums.items()}


def comm_by_group(reports: list[RunReport], top: int = TOP) -> list[ComparedCommGroup]:
    """The runs' communication by dimension (or group) and phase side by side, the largest
    first; empty where every run is data-parallel only (``beyond_data_parallel``)."""
    if not any(beyond_data_parallel(r) for r in reports):
        return []
    per_run = [_comm_of(r) for r in reports]
    keys = sorted(
        {k for run in per_run for k in run},
        key=lambda k: (-max(run.get(k, (0.0,))[0] for run in per_run), str(k)),
    )
    rows = []
    for key in keys[:top]:
        found = [run.get(key) for run in per_run]
        totals = [round(f[0], 3) if f else None for f in found]
        base = totals[0]
        rows.append(
            ComparedCommGroup(
                dim=key[0],
                group=key[1],
                phase=key[2],
                op=key[3],
                total_ms=totals,
                exposed_ms=[round(f[1], 3) if f else None for f in found],
                wait_ms=[round(f[2], 3) if f else None for f in found],
                ratio=[_ratio(t, base) if t is not None and base else None for t in totals],
            )
        )
    return rows


def _parallel_highlights(runs: list[ComparedRun], rows: list[ComparedCommGroup]) -> list[str]:
    """Where a pipeline's bubble or a dimension's communication differs notably from the
    baseline's."""
    out = []
    base = runs[0]
    for i, run in enumerate(runs[1:], 1):
        a, b = base.pipeline, run.pipeline
        if a is not None and b is not None:
            low, high = sorted((a.bubble_fraction, b.bubble_fraction))
            if low > 0 and high / low >= NOTABLE_RATIO:
                out.append(
                    f"{run.label}'s pipeline bubble is {b.bubble_fraction:.0%} of the stages' time "
                    f"against {base.label}'s {a.bubble_fraction:.0%} (ideal "
                    f"{_share(b.ideal_bubble_fraction)} and {_share(a.ideal_bubble_fraction)})"
                )
        notable = []
        for row in rows:
            x, y = row.total_ms[0], row.total_ms[i]
            if not x or not y:
                continue
            slow, fast = max(x, y), min(x, y)
            step = run.step_ms if y >= x else base.step_ms
            if slow / fast >= NOTABLE_RATIO and slow >= NOTABLE_PHASE_SHARE * step:
                slower, faster = (run.label, base.label) if y > x else (base.label, run.label)
                notable.append(
                    (
                        slow - fast,
                        f"{slower}'s {row.label()} takes {slow / fast:.1f}× {faster}'s "
                        f"({slow:.2f} against {fast:.2f} ms per step)",
                    )
                )
        out += [text for _, text in sorted(notable, key=lambda x: -x[0])[:3]]
    return out


def compare(
    reports: list[RunReport], ops: list[pa.Table], labels: list[str], top: int = TOP
) -> Comparison:
    """The comparison of runs; the first run is the baseline every ratio is taken against."""
    base = reports[0].summary
    runs = [
        ComparedRun(
            label=label,
            framework=report.run.framework,
            ranks=report.run.ranks,
            steps=report.run.steps,
            timeline=report.run.timeline,
            step_ms=report.summary.step_ms,
            step_ratio=_ratio(report.summary.step_ms, base.step_ms),
            breakdown_ms=report.summary.breakdown_ms,
            comm_total_ms=report.summary.comm_total_ms,
            comm_hidden_fraction=report.summary.comm_hidden_fraction,
            hidden=report.summary.hidden,
            bottleneck=report.summary.bottleneck,
            comm_wait_ms=report.summary.comm_wait_ms,
            comm_transfer_ms=report.summary.comm_transfer_ms,
            straggler_rank=report.summary.straggler_rank
            if report.summary.straggler_significant
            else None,
            straggler_phase=report.summary.straggler_phase,
            host_bound_ms=report.summary.host_bound_ms,
            pipeline=report.pipeline,
            cause=report.summary.cause,
            architecture=report.run.architecture,
            synchronous=report.run.synchronous,
            worker_steps_per_s=_throughput(report),
            workers=_workers(report),
        )
        for label, report in zip(labels, reports, strict=True)
    ]
    phases: list[ComparedPhase] = []
    for phase in S.BREAKDOWN_PHASES:
        values = [r.summary.breakdown_ms[phase] for r in reports]
        phases.append(
            ComparedPhase(phase=phase, ms=values, ratio=[_ratio(v, values[0]) for v in values])
        )

    times = [op_times(table, report) for table, report in zip(ops, reports, strict=True)]
    names = sorted(
        {name for t in times for name in t}, key=lambda n: -max(t.get(n, 0.0) for t in times)
    )
    rows: list[ComparedOp] = []
    for name in names[:top]:
        values = [t.get(name, 0.0) for t in times]
        rows.append(ComparedOp(op=name, ms=values, ratio=[_ratio(v, values[0]) for v in values]))

    highlights = []
    for row in phases:
        base_ms = row.ms[0]
        for label, value, run in zip(labels[1:], row.ms[1:], runs[1:], strict=True):
            slow, fast = max(value, base_ms), min(value, base_ms)
            step = run.step_ms if value >= base_ms else runs[0].step_ms
            if fast > 0 and slow / fast >= NOTABLE_RATIO and slow >= NOTABLE_PHASE_SHARE * step:
                slower, faster = (label, labels[0]) if value > base_ms else (labels[0], label)
                what = "exposed comm" if row.phase == S.COMM else row.phase
                highlights.append(
                    f"{slower}'s {what} takes {slow / fast:.1f}× {faster}'s"
                    f" ({slow:.2f} against {fast:.2f} ms per step)"
                )
    notable_ops = []
    for op_row in rows:
        base_ms = op_row.ms[0]
        for label, value, run in zip(labels[1:], op_row.ms[1:], runs[1:], strict=True):
            if base_ms <= 0 or value <= 0:
                continue
            slow, fast = max(value, base_ms), min(value, base_ms)
            share = slow / max(run.step_ms if value >= base_ms else runs[0].step_ms, 1e-9)
            if slow / fast >= NOTABLE_RATIO and share >= NOTABLE_SHARE:
                slower, faster = (label, labels[0]) if value > base_ms else (labels[0], label)
                notable_ops.append(
                    (slow - fast, f"{slower}'s {op_row.op} takes {slow / fast:.1f}× {faster}'s")
                )
    # the operators that cost the most time, not the largest ratios of small numbers
    highlights += [text for _, text in sorted(notable_ops, key=lambda x: -x[0])[:MAX_OP_HIGHLIGHTS]]
    for run in runs:  # each run's cause, as its report states it
        if run.cause is not None:
            highlights.append(f"{run.label}: {cause_brief(run.cause)}")
    for run in runs:
        if run.straggler_rank is not None and run.comm_wait_ms:
            phase = f" (its {run.straggler_phase})" if run.straggler_phase else ""
            highlights.append(
                f"{run.label}: the ranks wait {run.comm_wait_ms:.2f} ms per step for rank "
                f"{run.straggler_rank}{phase} in communication"
            )
    for run, report in zip(runs, reports, strict=True):
        _add_memory(run, report)
    highlights += _memory_highlights(runs)
    by_group = comm_by_group(reports, top)
    highlights += _parallel_highlights(runs, by_group)
    lockstep = all(run.synchronous is not False for run in runs)
    for run in runs[1:] if lockstep else []:
        ratio = run.step_ratio
        if ratio and (ratio >= NOTABLE_RATIO or ratio <= 1 / NOTABLE_RATIO):
            highlights.insert(0, f"{run.label}'s step takes {ratio:.2f}× {labels[0]}'s")
    highlights[:0] = _throughput_highlights(runs)
    return Comparison(
        runs=runs, phases=phases, ops=rows, highlights=highlights, comm_by_group=by_group
    )


#: Past this many ranks a comparison lists no worker one by one.
MAX_COMPARED_WORKERS = 64


def _throughput(report: RunReport) -> float | None:
    """Worker steps per second: each worker's own rate summed (a parameter-server job), or
    every rank's step in lockstep (the job's step rate times the ranks)."""
    rates = [r.steps_per_s for r in report.ranks]
    if report.run.architecture == "parameter_server" and rates and None not in rates:
        return round(sum(r for r in rates if r is not None), 3)
    if report.summary.step_ms > 0 and report.ranks:
        return round(len(report.ranks) * 1e3 / report.summary.step_ms, 3)
    return None


def _workers(report: RunReport) -> list[ComparedWorker]:
    if len(report.ranks) > MAX_COMPARED_WORKERS:
        return []
    lockstep = 1e3 / report.summary.step_ms if report.summary.step_ms > 0 else None
    return [
        ComparedWorker(
            rank=r.rank,
            step_ms=r.step_ms,
            steps_per_s=r.steps_per_s if r.steps_per_s is not None else lockstep,
            comm_wait_ms=r.comm_wait_ms,
            staleness=r.staleness,
        )
        for r in report.ranks
    ]


def _throughput_highlights(runs: list[ComparedRun]) -> list[str]:
    """Where some run is a parameter-server job, how the runs' throughputs compare (a mean step
    is not the job's where the workers keep their own pace)."""
    if all(run.architecture == "collective" for run in runs):
        return []
    base = runs[0]
    said = []
    for run in runs[1:]:
        if not base.worker_steps_per_s or not run.worker_steps_per_s:
            continue
        if run.architecture == base.architecture == "collective":
            continue  # (lockstep both: the step ratio says it)
        ratio = run.worker_steps_per_s / base.worker_steps_per_s
        said.append(
            f"{run.label} ({kind_of(run)}) trains at {ratio:.2f}× {base.label}'s ({kind_of(base)}) "
            f"worker steps per second ({run.worker_steps_per_s:.1f} against "
            f"{base.worker_steps_per_s:.1f}, summed over {len(run.workers) or run.ranks} and "
            f"{len(base.workers) or base.ranks} workers)"
        )
    return said


def _share(fraction: float | None) -> str:
    return f"{fraction:.0%}" if fraction is not None else "n/a"
