"""The terminal report: the run report, the comparison and the scaling analysis as text.

It renders ``traceview.model.results`` structs and computes nothing; ``--json`` is the struct itself.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from traceview.model import vocabulary as S
from traceview.model.escape import json_safe, safe
from traceview.model.results import (
    ComparedRun,
    Comparison,
    RankSpread,
    Result,
    RunReport,
    Scaling,
    Spread,
)
from traceview.views.roles import servers_text, workers_table
from traceview.views.style import (
    HOST_BOUND_HEADER,
    HOST_BOUND_NOTE,
    KERNEL_COLUMNS,
    KERNEL_NOTE,
    PHASE_LETTER,
    PHASE_STYLE,
    SHORT,
    communication_text,
    count,
    critical_path_text,
    device_kind,
    duration_us,
    failure_text,
    fsdp_text,
    gpu_verdict_text,
    host_bound_cell,
    ideal_share,
    incomplete_text,
    kernel_cells,
    kernel_rank,
    ms,
    pct,
    phase_bar,
    pipeline_text,
    ratio_text,
    shown_notes,
    straggler_text,
    title_text,
    verdict_text,
    whole_run_text,
)


def _table(title: str) -> Table:
    """A report table: its title on the left, no box, columns one space apart."""
    return Table(title=title, title_justify="left", box=None, pad_edge=False, padding=(0, 1))


def to_json(result: Result) -> str:
    return json_safe(result.to_json().decode())


class _ReportConsole(Console):
    def on_broken_pipe(self) -> None:
        """A reader that closed the pipe (``report | head``) has what it wanted: the command
        ends with exit 0 (traceview.cli), not rich's exit 1."""
        self.quiet = True
        raise BrokenPipeError


def _console() -> Console:
    return _ReportConsole(highlight=False, markup=False, emoji=False)


#: Above this many ranks the text report shows them as a distribution (--all-ranks: every one).
RANK_ROWS = 16
#: rows of the operators outside the steps in the text (the JSON has --top of them)
OUTSIDE_ROWS = 5


def render(report: RunReport, console: Console, *, top: int = 10, all_ranks: bool = False) -> None:
    run, summary, ranks = report.run, report.summary, report.ranks
    console.print(title_text(report))
    job = run.job
    if job:
        line = Text(
            f"job: {safe(' '.join(map(str, job.command or [])), 120)} · exit code {job.exit_code}"
        )
        if job.clock_uncertainty_us is not None:
            line.append(
                f" · clocks aligned to ±{job.clock_uncertainty_us:g} µs"
                f" (largest offset {job.max_clock_offset_us or 0:g} µs)"
            )
        console.print(line, style="bright_black")
    whole = whole_run_text(report.whole_run)
    if whole is not None:
        console.print(whole)
    clocks = run.clocks
    if clocks is not None and clocks.source == "collectives" and not clocks.max_offset_us:
        console.print(
            f"clocks: {clocks.calls} matched calls show no offset between the ranks beyond "
            f"their spread (residual ±{duration_us(clocks.residual_us or 0)})",
            style="bright_black",
        )
    elif clocks is not None and clocks.source == "collectives":
        console.print(
            f"clocks: estimated from {clocks.calls} matched calls (offsets up to "
            f"{duration_us(clocks.max_offset_us or 0)}, drift up to {clocks.max_drift_ppm:g} "
            f"ppm), residual ±{duration_us(clocks.residual_us or 0)}",
            style="bright_black",
        )
    if report.failure is not None or any(r.state != "finished" for r in report.ranks_at_end):
        _failure(report, console, all_ranks)
        if not ranks:  # (no rank wrote a trace: the step record's account is all there is)
            _notes(report, console)
            return
    console.print(verdict_text(report))
    gpu_line = gpu_verdict_text(report)
    if gpu_line is not None:
        console.print(gpu_line)
    if report.incomplete_steps:
        console.print(incomplete_text(report))
    console.print()

    breakdown = _table("Per step (exclusive, mean of ranks)")
    breakdown.add_column("phase")
    breakdown.add_column("ms", justify="right")
    breakdown.add_column("share", justify="right")
    bound = summary.host_bound_ms  # GPU runs: the part of each phase the device waited
    if bound is not None:
        breakdown.add_column(HOST_BOUND_HEADER, justify="right")
    breakdown.add_column("")
    step = summary.step_ms or 1.0
    for phase, value in summary.breakdown_ms.items():
        width = round(value / step * 30)
        bar = Text(PHASE_LETTER[phase] * width, style=f"reverse {PHASE_STYLE[phase]}")
        phase_row: list[Text | str] = [
            Text(phase, style=PHASE_STYLE[phase]),
            ms(value),
            pct(value / step),
        ]
        if bound is not None:
            phase_row.append(host_bound_cell(bound, phase))
        breakdown.add_row(*phase_row, bar)
    breakdown.add_row(
        Text("step", style="bold"),
        Text(ms(summary.step_ms), style="bold"),
        "100%",
        *([""] if bound is not None else []),
        "",
    )
    console.print(breakdown)
    if bound is not None:
        console.print(Text(HOST_BOUND_NOTE, style="bright_black"))
    console.print()

    console.print(communication_text(report))
    if summary.straggler_rank is not None:
        console.print(straggler_text(report))
    if (served := servers_text(report)) is not None:
        console.print(served)
    if report.pipeline is not None:
        console.print(pipeline_text(report.pipeline))
    path_text = critical_path_text(report)
    if path_text is not None:
        console.print(path_text)
    console.print()

    spread = report.rank_spread
    if spread is not None and len(ranks) > RANK_ROWS and not all_ranks:
        _rank_spread_table(report, spread, console)
    elif ranks:
        table = _table("Per rank (ms per step)")
        table.add_column("rank", justify="right")
        table.add_column("step", justify="right")
        for phase in S.BREAKDOWN_PHASES:
            table.add_column(SHORT[phase], justify="right", style=PHASE_STYLE[phase])
        table.add_column("hidden", justify="right")
        waits = summary.comm_wait_ms is not None  # collectives matched across ranks
        if waits:
            table.add_column("wait", justify="right", style=PHASE_STYLE[S.COMM])
        bar_width = console.width - (83 if waits else 76)
        if bar_width >= 10:
            table.add_column("", no_wrap=True)
        for row in sorted(ranks, key=lambda r: r.rank):
            mark = "*" if row.straggler else ""
            cells: list[Text | str] = [
                Text(f"{row.rank}{mark}", style="bold" if row.straggler else ""),
                ms(row.step_ms),
                *(ms(value) for _, value in row.breakdown_ms.items()),
                pct(row.comm_hidden_fraction) if row.comm_total_ms > 0 else "-",
            ]
            if waits:
                cells.append(ms(row.comm_wait_ms) if row.comm_wait_ms is not None else "-")
            if bar_width >= 10:
                cells.append(phase_bar(row.breakdown_ms, min(bar_width, 40)))
            table.add_row(*cells)
        console.print(table)
        if report.straggler is not None:
            console.print(Text("* the straggler", style="bright_black"))
        if waits:
            console.print(
                Text(
                    "wait: the part of comm spent waiting for the last rank to arrive at a "
                    "collective (the rest is transfer)",
                    style="bright_black",
                )
            )
        console.print()

    if any(r.gpu is not None for r in ranks):
        _gpu_tables(report, console, top)
    if summary.memory is not None:
        _memory_table(report, console, all_ranks)

    if report.collectives:
        _collectives_table(report, console, top)
    if _several_dimensions(report):
        _comm_by_group(report, console, top)
    if report.fsdp_gathers:
        _fsdp_gathers(report, console, top)
    if any(a.split_imbalance is not None for a in report.alltoall):
        _alltoall(report, console, top)

    if report.top_ops:
        ops = _table("Top operators (per counted step)")
        ops.add_column("op", no_wrap=True, overflow="ellipsis", max_width=24)
        ops.add_column("phase", no_wrap=True)
        ops.add_column("on", no_wrap=True)
        ops.add_column("calls", justify="right", no_wrap=True)
        ops.add_column("self ms", justify="right", no_wrap=True)
        ops.add_column("total ms", justify="right", no_wrap=True)
        name_width = max(console.width - 66, 12)
        ops.add_column("name in the trace", no_wrap=True, overflow="ellipsis", max_width=name_width)
        for op in report.top_ops[:top]:
            ops.add_row(
                Text(safe(op.op, 60)),
                Text(SHORT.get(op.phase, op.phase), style=PHASE_STYLE.get(op.phase, "")),
                op.device,
                f"{op.calls_per_step:g}",
                ms(op.self_ms_per_step),
                ms(op.total_ms_per_step),
                Text(safe(op.name, 200)),
            )
        console.print(ops)
        console.print()
    if report.outside_ops:
        _outside_ops(report, console, min(top, OUTSIDE_ROWS))

    _notes(report, console)


def _notes(report: RunReport, console: Console) -> None:
    for warning in shown_notes(report.warnings):
        console.print(Text("warning: " + safe(warning), style="yellow"))
    for remark in shown_notes(report.remarks, "note"):
        console.print(Text("note: " + safe(remark), style="bright_black"))


#: Ranks listed one per line at the end of a failed job (more: counted by state, the rest named
#: with --all-ranks).
FAILED_RANKS_SHOWN = 16


def _failure(report: RunReport, console: Console, all_ranks: bool) -> None:
    """What went wrong first, where the rank stood (its script's innermost frames), and where
    every rank was when the job ended; then the profiled window's report follows."""
    said = failure_text(report)
    if said is not None:
        console.print(said)
    ends = report.ranks_at_end
    if not ends:
        return
    shown = ends if all_ranks or len(ends) <= FAILED_RANKS_SHOWN else [
        r for r in ends if r.state != "finished"
    ][:FAILED_RANKS_SHOWN]  # fmt: skip
    table = _table("Where each rank was when the job ended")
    for column in ("rank", "step", "state", "in", "since"):
        table.add_column(column, justify="right" if column in ("rank", "step", "since") else "left")
    for r in shown:
        table.add_row(
            str(r.rank), "" if r.last_step is None else str(r.last_step), r.state,
            safe(r.in_ or "", 80), "" if r.since_s is None else f"{r.since_s:.1f} s",
        )  # fmt: skip
    console.print(table)
    if len(shown) < len(ends):
        counts: dict[str, int] = {}
        for r in ends:
            counts[r.state] = counts.get(r.state, 0) + 1
        words = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        console.print(
            f"  {len(ends)} ranks: {words} (--all-ranks lists each)", style="bright_black"
        )
    if report.ranks:
        console.print("the profiled window, before it:", style="bright_black")


def _outside_ops(report: RunReport, console: Console, top: int) -> None:
    """What ran outside the counted steps (model set-up, warm-up steps, teardown): apart from
    the per-step figures, which it would otherwise swell."""
    table = _table("Outside the counted steps (set-up, warm-up, teardown; ms in all)")
    table.add_column("op", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("on", no_wrap=True)
    for name in ("calls", "self ms", "total ms"):
        table.add_column(name, justify="right", no_wrap=True)
    name_width = max(console.width - 58, 12)
    table.add_column("name in the trace", no_wrap=True, overflow="ellipsis", max_width=name_width)
    for op in report.outside_ops[:top]:
        table.add_row(
            Text(safe(op.op, 60)),
            op.device,
            f"{op.calls:g}",
            ms(op.self_ms),
            ms(op.total_ms),
            Text(safe(op.name, 200)),
        )
    console.print(table)
    console.print()


def _gpu_tables(report: RunReport, console: Console, top: int) -> None:
    """The device's time explained: per rank, then one rank's phases and kernel launches."""
    gpus = [(r.rank, r.gpu) for r in sorted(report.ranks, key=lambda r: r.rank) if r.gpu]
    kind = device_kind(report) or "GPU"
    table = _table(f"{kind} (ms per step): device busy, and idle by what the host does")
    for name in ("rank", "busy", "ms", "host-bound", "data", "other", "sync", "n"):
        table.add_column(name, justify="right")
    table.add_column("launch\np50/p95", justify="right")
    table.add_column("queued", justify="right")
    table.add_column("short", justify="right")
    for rank, gpu in gpus[:RANK_ROWS]:
        latency = (
            f"{gpu.launch_latency_us_p50:,.0f}/{gpu.launch_latency_us_p95:,.0f}"
            if gpu.launch_latency_us_p50 is not None and gpu.launch_latency_us_p95 is not None
            else "-"
        )
        short = gpu.short_kernel_fraction
        table.add_row(
            str(rank),
            pct(gpu.busy_fraction),
            ms(gpu.busy_ms),
            ms(gpu.idle_ms.host_bound),
            ms(gpu.idle_ms.data),
            ms(gpu.idle_ms.other),
            ms(gpu.sync_ms),
            f"{gpu.launches:g}",
            latency,
            pct(queued) if (queued := gpu.launch_queued_fraction) is not None else "-",
            pct(short) if short is not None else "-",
        )
    console.print(table)
    console.print(
        Text(
            "host-bound: the device waits while the host is inside a phase, launching its "
            "work; sync: the host blocked waiting for the device; n: kernels launched per "
            "step; launch: launch latency in µs (p50/p95), "
            "the kernel's stream idle while it had not started; queued: the share of the "
            "launch delay its stream was busy with earlier work (queueing, healthy); short: "
            "kernels shorter than the call that launched them",
            style="bright_black",
        )
    )
    console.print()
    focus = kernel_rank(report)
    assert focus is not None  # called for GPU runs only
    rank, gpu = focus
    phases = _table(f"{device_kind(report) or 'GPU'} phases, rank {rank} (ms per step)")
    for name in ("phase", "device", "host-bound", "sum"):
        phases.add_column(name, justify="left" if name == "phase" else "right")
    for p in gpu.phases:
        if p.total_ms > 0:
            phases.add_row(
                Text(p.phase, style=PHASE_STYLE.get(p.phase, "")),
                ms(p.device_ms),
                ms(p.host_bound_ms),
                ms(p.total_ms),
            )
    console.print(phases)
    console.print()
    if gpu.kernels:
        kernels = _table(f"Kernel launches, rank {rank} (n: per step; dur: kernel duration)")
        kernels.add_column("op", no_wrap=True, overflow="ellipsis", max_width=28)
        for i, name in enumerate(KERNEL_COLUMNS):
            kernels.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
        for k in gpu.kernels[:top]:
            kernels.add_row(Text(safe(k.op or "?", 60)), *kernel_cells(k))
        console.print(kernels)
        console.print(Text(KERNEL_NOTE, style="bright_black"))
        console.print()


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _memory_table(report: RunReport, console: Console, all_ranks: bool) -> None:
    """Per rank: its peak allocated memory, where it peaked, its reserve and its growth."""
    run = report.summary.memory
    assert run is not None
    rows = sorted((r for r in report.ranks if r.memory is not None), key=lambda r: r.rank)
    shown = rows
    if len(rows) > RANK_ROWS and not all_ranks:  # the highest peaks only
        shown = sorted(rows, key=lambda r: -(r.memory.peak_mb or 0.0) if r.memory else 0.0)[:5]
    since = any(r.memory is not None and r.memory.since_profiling_started for r in rows)
    title = "Memory (MiB allocated" + (", CPU: since profiling started" if since else "") + ")"
    if len(shown) < len(rows):
        title += f", the {len(shown)} highest peaks of {len(rows):,} ranks"
    table = _table(title)
    widths = {"rank": 5, "device": 8, "peak": 9, "phase": 8, "step": 4, "reserved": 9}
    for name, width in widths.items():
        right = name in ("rank", "peak", "step", "reserved")
        table.add_column(name, justify="right" if right else "left", no_wrap=True, min_width=width)
    table.add_column("growth/step", justify="right", no_wrap=True, min_width=11)
    op_width = max(console.width - 66, 12)
    table.add_column("op", no_wrap=True, overflow="ellipsis", max_width=op_width)
    for row in shown:
        memory = row.memory
        assert memory is not None
        phase = memory.peak_phase
        growth = _mib(memory.growth_mb_per_step)
        if memory.growth in ("leak", "creep"):
            growth = f"{growth} {memory.growth}"
        flagged = row.rank == run.peak_rank and bool(run.imbalanced)
        table.add_row(
            Text(f"{row.rank}{'!' if flagged else ''}", style="bold" if flagged else ""),
            Text(safe(memory.device, 16)),
            _mib(memory.peak_mb),
            Text(phase or "-", style=PHASE_STYLE.get(phase or "", "")),
            "-" if memory.peak_step is None else str(memory.peak_step),
            _mib(memory.reserved_peak_mb),
            growth,
            Text(safe(memory.peak_op or "-", 40)),
        )
    console.print(table)
    if run.excess_mb is not None:
        line = (
            f"highest peak: rank {run.peak_rank}, {_mib(run.peak_mb)} MiB on "
            f"{safe(run.device, 16)}, {_mib(run.excess_mb)} MiB above the other ranks' median "
            f"({_mib(run.median_mb)} MiB)" + (" !: far above" if run.imbalanced else "")
        )
        console.print(Text(line, style="bright_black"))
    console.print()


def _rank_spread_table(report: RunReport, spread: RankSpread, console: Console) -> None:
    table = _table(f"Ranks (ms per step, distribution over {spread.ranks:,} ranks)")
    for name in ("", "p50", "p90", "max", "rank", "min", "rank"):
        table.add_column(name, justify="left" if not name else "right")
    rows: list[tuple[Text, Spread]] = [(Text("step", style="bold"), spread.step_ms)]
    rows += [
        (Text(phase, style=PHASE_STYLE[phase]), spread.breakdown_ms[phase])
        for phase in S.BREAKDOWN_PHASES
    ]
    rows.append((Text("busy"), spread.busy_ms))
    rows.append((Text("blocked"), spread.blocked_ms))
    if spread.comm_wait_ms is not None:
        rows.append((Text("wait", style=PHASE_STYLE[S.COMM]), spread.comm_wait_ms))
    for label, figure in rows:
        same = ms(figure.max) == ms(figure.min)  # no rank stands out: name none
        table.add_row(
            label,
            ms(figure.p50),
            ms(figure.p90),
            ms(figure.max),
            "" if same else str(figure.max_rank),
            ms(figure.min),
            "" if same else str(figure.min_rank),
        )
    console.print(table)
    busy = {r.rank: r.busy_ms for r in report.ranks}
    slowest = ", ".join(f"{r} ({ms(busy[r])})" for r in spread.slowest_ranks)
    fastest = ", ".join(f"{r} ({ms(busy[r])})" for r in spread.fastest_ranks)
    console.print(Text(f"most own work: ranks {slowest}; least: {fastest}", style="bright_black"))
    console.print(
        Text(
            "busy: the rank's own work (step - exposed comm - idle); blocked: exposed comm + "
            "idle. --all-ranks lists every rank; --json keeps them all",
            style="bright_black",
        )
    )
    console.print()


def _several_dimensions(report: RunReport) -> bool:
    """Whether the run's communication is of several kinds (a mesh's dimensions, FSDP's gathers
    and reduce-scatters in two phases, a pipeline's pairs): then it is told by group and phase."""
    kinds = {(c.phase, c.op) for c in report.comm_by_group}
    return len(kinds) > 1 or any(c.dim for c in report.comm_by_group)


def _fsdp_gathers(report: RunReport, console: Console, top: int) -> None:
    """FSDP's all-gathers per phase in words, then the units whose gathers are most exposed."""
    console.print(fsdp_text(report, top))
    console.print()


def _alltoall(report: RunReport, console: Console, top: int) -> None:
    """All-to-alls with recorded split sizes (expert parallelism): how uneven each rank's
    splits are and what that costs, the costliest ranks first."""
    rows = sorted(report.alltoall, key=lambda a: -(a.imbalance_ms or 0.0))[: max(top, 4)]
    console.print(Text("All-to-all splits (ms per step; imbalance: largest split over the mean)"))
    for a in rows:
        if a.split_imbalance is None:
            continue
        sent = f", {a.bytes_per_step:,} bytes" if a.bytes_per_step is not None else ""
        console.print(
            Text(
                f"  rank {a.rank} (group {safe(a.group, 40)}): {a.calls_per_step:g} calls{sent}, "
                f"transfer {ms(a.transfer_ms)} ms, imbalance {a.split_imbalance:.2f}x"
                f" (an even split would save {ms(a.imbalance_ms or 0.0)} ms)"
            )
        )
    if len(report.alltoall) > len(rows):
        console.print(Text(f"  ({len(report.alltoall) - len(rows)} more in report --json)"))
    console.print()


def _comm_by_group(report: RunReport, console: Console, top: int) -> None:
    """Communication per group, issuing phase and collective, in words: the largest first."""
    rows = sorted(report.comm_by_group, key=lambda c: c.total_ms, reverse=True)[: max(top, 4)]
    console.print(Text("Communication by group and phase (ms per step, mean of the group's ranks)"))
    for c in rows:
        where = f"{safe(c.dim)} group {safe(c.group)}" if c.dim else f"group {safe(c.group)}"
        exposed = c.exposed_ms / c.total_ms if c.total_ms else 0.0
        console.print(
            Text(
                f"  {where}, {safe(c.op)} in {c.phase}: {c.calls_per_step:g}/step, "
                f"{ms(c.total_ms)} ms, {pct(exposed)} exposed (wait {ms(c.wait_ms)}, "
                f"transfer {ms(c.transfer_ms)})"
            )
        )
    if len(report.comm_by_group) > len(rows):
        console.print(Text(f"  ... {len(report.comm_by_group) - len(rows)} more in --json"))
    console.print()


def _collectives_table(report: RunReport, console: Console, top: int) -> None:
    """The collectives with the most time, matched across ranks: wait, transfer, skew."""
    rows = sorted(report.collectives, key=lambda c: c.wait_ms + c.transfer_ms, reverse=True)
    table = _table("Collectives across ranks (ms per call, mean of ranks)")
    table.add_column("op", no_wrap=True, overflow="ellipsis", max_width=12)
    table.add_column("#", justify="right")
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("transfer", justify="right")
    table.add_column("wait", justify="right")
    table.add_column("skew", justify="right")
    table.add_column("last", justify="right")
    table.add_column("Gb/s", justify="right")
    name_width = max(console.width - 62, 12)
    table.add_column("name in the trace", no_wrap=True, overflow="ellipsis", max_width=name_width)
    for c in rows[:top]:
        table.add_row(
            Text(safe(c.op, 40)),
            str(c.position),
            f"{c.bytes:,}" if c.bytes is not None else "-",
            ms(c.transfer_ms),
            ms(c.wait_ms),
            ms(c.skew_ms),
            str(c.last_rank),
            f"{c.busbw_gbps:.3g}" if c.busbw_gbps is not None else "-",
            Text(safe(c.name, 200)),
        )
    console.print(table)
    more = len(rows) - top
    note = (
        "#: the call's place among the step's calls of its name; last: the rank most often "
        "last; Gb/s: bus bandwidth over the transfer, where the trace gives sizes"
    )
    if more > 0:
        note += f"; {more} more in --json"
    console.print(Text(note, style="bright_black"))
    console.print()


def render_to_console(report: RunReport, *, top: int = 10, all_ranks: bool = False) -> None:
    render(report, _console(), top=top, all_ranks=all_ranks)


def render_comparison(result: Comparison, console: Console) -> None:
    runs = result.runs
    labels = [safe(r.label, 24, middle=True) for r in runs]
    console.print(
        Text("traceview compare", style="bold")
        + Text(f" · {len(runs)} runs · baseline {labels[0]}")
    )
    for run, label in zip(runs, labels, strict=True):
        line = Text(f"  {label}: ", style="bold")
        line.append(
            f"{safe(run.framework or '?')}, {count(run.ranks, 'rank')}, "
            f"{count(run.steps, 'step')}, {run.timeline or '?'} timeline"
        )
        if run.memory_peak_mb is not None:
            phase = f", {run.memory_peak_phase}" if run.memory_peak_phase else ""
            since = " since profiling started" if run.memory_since_profiling_started else ""
            line.append(
                f"; memory peak {run.memory_peak_mb:,.1f} MiB{since} (rank "
                f"{run.memory_peak_rank}, {safe(run.memory_device or '?', 16)}{phase})"
            )
        console.print(line)
    console.print()
    for highlight in result.highlights:
        console.print(Text("• " + safe(highlight, 200)))
    if result.highlights:
        console.print()

    def cells(values: list[float], ratios: list[float | None]) -> list[Text | str]:
        # an operator a run does not have reads "-", not 0.00 ms ×0.00
        out: list[Text | str] = [ms(values[0]) if values[0] else "-"]
        for value, ratio in zip(values[1:], ratios[1:], strict=True):
            out += [ms(value), ratio_text(ratio)] if value else ["-", ""]
        return out

    def table(title: str, first: str, rows: list[list[Text | str]]) -> Table:
        # Numbers and ratios keep their full width; where the terminal is too narrow, the row
        # names and the run labels in the header give way (ellipsis), widest first.
        cols = len(rows[0])
        need = [max(len(str(row[i])) for row in rows) for i in range(cols)]
        headers = [first] + [
            h for i, label in enumerate(labels) for h in ([label, ""] if i else [label])
        ]
        floor = [min(need[0], 8), *need[1:]]
        widths = [min(26, max(need[0], len(first)))] + [
            min(max(22, n), max(n, len(h))) for n, h in zip(need[1:], headers[1:], strict=True)
        ]
        excess = sum(widths) + 2 * (cols - 1) - console.width
        while excess > 0:
            i = max(range(cols), key=lambda c: widths[c] - floor[c])
            if widths[i] <= floor[i]:
                break  # nothing left to give: rich crops what remains
            widths[i] -= 1
            excess -= 1
        t = _table(title)
        for i, (header, width) in enumerate(zip(headers, widths, strict=True)):
            t.add_column(
                header,
                justify="left" if i == 0 else "right",
                no_wrap=True,
                overflow="ellipsis",
                width=width,
            )
        for row in rows:
            t.add_row(*row)
        return t

    rows: list[list[Text | str]] = [
        [Text(row.phase, style=PHASE_STYLE[row.phase]), *cells(row.ms, row.ratio)]
        for row in result.phases
    ]
    rows.append(
        [
            Text("step", style="bold"),
            *cells([r.step_ms for r in runs], [r.step_ratio for r in runs]),
        ]
    )
    hidden: list[Text | str] = [Text("comm hidden")]
    for i, run in enumerate(runs):
        hidden.append(pct(run.comm_hidden_fraction) if run.hidden != "n/a" else "-")
        if i:
            hidden.append("")
    rows.append(hidden)
    if any(run.comm_wait_ms is not None for run in runs):
        split: list[Text | str] = [Text("comm: wait", style=PHASE_STYLE[S.COMM])]
        for i, run in enumerate(runs):
            split.append(ms(run.comm_wait_ms) if run.comm_wait_ms is not None else "-")
            if i:
                split.append("")
        rows.append(split)
    console.print(table("Per step (ms, exclusive)", "phase", rows))
    console.print()
    if (workers := workers_table(result)) is not None:
        console.print(workers, "")

    if result.comm_by_group:
        comm_rows = [
            [Text(safe(c.label(), 60)), *cells([t or 0.0 for t in c.total_ms], c.ratio)]
            for c in result.comm_by_group
        ]
        # (the title on its own line: a table as narrow as its figures would wrap it)
        console.print(Text("Communication by group and phase (ms per step)", style="italic"))
        console.print(table("", "collective", comm_rows))
        console.print()
    if any(run.pipeline is not None for run in runs):
        console.print(table("Pipeline (ms per step)", "stage", _pipeline_rows(runs, cells)))
        console.print()

    if result.ops:
        op_rows = [
            [Text(safe(op_row.op, 60)), *cells(op_row.ms, op_row.ratio)] for op_row in result.ops
        ]
        console.print(table("Canonical operators (ms per step)", "op", op_rows))
        console.print(
            Text(
                "operators: device time of their kernels on GPU runs, inclusive host time on CPU runs",
                style="bright_black",
            )
        )


def _pipeline_rows(
    runs: list[ComparedRun], cells: Callable[[list[float], list[float | None]], list[Text | str]]
) -> list[list[Text | str]]:
    """The runs' pipelines side by side: the bubble's share of the stages' time (with the
    schedule's ideal), then each stage's compute and bubble."""
    pipes = [run.pipeline for run in runs]
    share: list[Text | str] = [Text("bubble share (ideal)", style="bold")]
    for i, pipe in enumerate(pipes):
        share.append(f"{pct(pipe.bubble_fraction)} ({ideal_share(pipe)})" if pipe else "-")
        if i:
            share.append("")
    rows = [share]
    stages = max(len(pipe.stages) for pipe in pipes if pipe is not None)
    for stage in range(min(stages, 16)):
        for what in ("compute", "bubble"):
            values = []
            for pipe in pipes:
                found = (
                    pipe.stages[stage] if pipe is not None and stage < len(pipe.stages) else None
                )
                values.append(getattr(found, f"{what}_ms") if found is not None else 0.0)
            base = values[0]
            ratios = [round(v / base, 3) if base > 0 else None for v in values]
            rows.append([Text(f"stage {stage} {what}"), *cells(values, ratios)])
    return rows


def render_comparison_to_console(result: Comparison) -> None:
    render_comparison(result, _console())


def _predictions(result: Scaling, own_compute: bool, title: str) -> Table:
    """Each run's measured step beside each model's prediction (from the smallest run's
    breakdown, or with ``own_compute`` its own) and its error."""
    table = _table(title)
    table.add_column("ranks", justify="right")
    table.add_column("measured", justify="right")
    for name in result.models:
        table.add_column(name, justify="right", no_wrap=True)
    for run in result.runs:
        row: list[Text | str] = [str(run.ranks), ms(run.step_ms)]
        for name in result.models:
            p = run.predicted_own_compute[name] if own_compute else run.predicted[name]
            err = f" ({pct(p.error)})" if p.error is not None else ""
            bold = not own_compute and name == result.best_model
            row.append(Text(f"{ms(p.step_ms)}{err}", style="bold" if bold else ""))
        table.add_row(*row)
    return table


def render_scaling(result: Scaling, console: Console) -> None:
    base = result.base
    console.print(
        Text("traceview scaling", style="bold") + Text(f" · {len(result.runs)} runs · weak scaling")
    )
    console.print(
        Text(
            f"baseline {safe(base.label, 40, middle=True)}: {count(base.ranks, 'rank')}, "
            f"{ms(base.step_ms)} ms per step"
        )
    )
    best = result.best_model
    if best:
        errors = ", ".join(
            f"{m} {pct(v.mean_error)}" for m, v in result.models.items() if v.mean_error is not None
        )
        console.print(Text(f"best fit: {best} (mean error {errors})"))
    console.print()

    measured = _table("Measured")
    for name in (
        "run",
        "ranks",
        "step ms",
        "speedup",
        "effic.",
        "samp/s",
        "comm ms",
        "wait",
        "hidden",
        "comp.",
    ):
        measured.add_column(
            name,
            justify="left" if name == "run" else "right",
            no_wrap=True,
            min_width=max(len(name), 5),
        )
    for run in result.runs:
        measured.add_row(
            Text(safe(run.label, 24, middle=True)),
            str(run.ranks),
            ms(run.step_ms),
            f"{run.speedup:.2f}" if run.speedup is not None else "-",
            pct(run.efficiency) if run.efficiency is not None else "-",
            f"{run.samples_per_s:,.0f}" if run.samples_per_s is not None else "-",
            ms(run.comm_total_ms),
            ms(run.comm_wait_ms) if run.comm_wait_ms is not None else "-",
            pct(run.comm_hidden_fraction) if run.comm_total_ms > 0 else "-",
            f"×{run.compute_ratio:.2f}" if run.compute_ratio is not None else "-",
        )
    console.print(measured)
    console.print(
        Text(
            "wait: exposed comm spent waiting for the last rank (imbalance: the models take "
            "the transfer alone as communication and add this wait as measured); samp/s: "
            "samples per second; "
            "comp.: each run's compute time per step against the smallest run's",
            style="bright_black",
        )
    )
    console.print()

    console.print(_predictions(result, False, "Predicted step ms (error against the measurement)"))
    if any((r.compute_ratio or 1.0) > 1.2 for r in result.runs):
        console.print()
        console.print(
            _predictions(
                result,
                True,
                "Same models, each run's own compute (comm model alone)",
            )
        )
    console.print()

    what_if = _table("What if (step ms / speedup)")
    what_if.add_column("ranks", justify="right")
    keys = list(dict.fromkeys(k for r in result.runs for k in r.what_if if k.endswith("_ms")))
    headers = {
        "comm_hidden_ms": "comm hidden",
        "io_hidden_ms": "io hidden",
        "balanced_ms": "balanced",
    }
    for key in keys:
        what_if.add_column(
            headers.get(key, key.removesuffix("_ms").replace("_", " ")), justify="right"
        )
    for run in result.runs:
        w = run.what_if
        what_if.add_row(
            str(run.ranks),
            *(
                f"{ms(w[k] or 0.0)} / {w.get(k.replace('_ms', '_speedup')) or 0:.2f}"
                if w.get(k) is not None
                else "-"
                for k in keys
            ),
        )
    console.print(what_if)

    if result.link_gbps:
        console.print()
        ar = _table(f"All-reduce against a {result.link_gbps:g} Gb/s link")
        for name in ("ranks", "MB per step", "algbw Gb/s", "busbw Gb/s", "efficiency"):
            ar.add_column(name, justify="right")
        for run in result.runs:
            a = run.allreduce
            if a:
                ar.add_row(
                    str(run.ranks), f"{a.bytes_per_step / 1e6:,.1f}", f"{a.algbw_gbps:.2f}",
                    f"{a.busbw_gbps:.2f}", pct(a.efficiency),
                )  # fmt: skip
            else:
                ar.add_row(str(run.ranks), "-", "-", "-", "-")
        console.print(ar)
    if result.extrapolated:
        console.print()
        beyond = _table("Ranks never run (modelled)")
        for name in ("ranks", "comm ms", "step ms", "speedup"):
            beyond.add_column(name, justify="right")
        for e in result.extrapolated:
            beyond.add_row(
                str(e.ranks), ms(e.comm_ms), ms(e.step_ms),
                f"{e.speedup:.2f}" if e.speedup is not None else "-",
            )  # fmt: skip
        console.print(beyond)
        fits = "; ".join(
            f"{safe(f.op)}: {f.latency_ms:g} ms per other rank + bytes at "
            + (f"{f.busbw_gbps:g} Gb/s bus bandwidth" if f.busbw_gbps else "no size term")
            for f in result.collective_model
        )
        console.print(Text(f"fitted on the matched calls: {fits}", style="bright_black"))
    for note in result.notes:
        console.print(Text("note: " + safe(note), style="bright_black"))


def render_scaling_to_console(result: Scaling) -> None:
    render_scaling(result, _console())
