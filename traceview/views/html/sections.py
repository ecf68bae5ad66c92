"""The report page's sections, in the order a reader needs them: the verdict and what would help
most, the step by phase, the critical path, communication, the ranks × steps heatmap, the
pipeline, memory, the what-ifs, the top operators, the warnings. Each only renders the
report's results (and the steps matrix): no figure is computed here that the JSON lacks, so
the page and ``report --json`` cannot disagree.

Past ``DRAWN_RANKS`` ranks the figures aggregate: percentile rows (p50, p90, max) and the
slowest and fastest ranks by name, with every rank still in a table folded away."""

from __future__ import annotations

import math
from collections import defaultdict

from traceview.analysis.heatmap import StepMatrix, bands, extremes, row_of
from traceview.model.results import Breakdown, CommByGroup, PathSegment, RunReport
from traceview.views.advice import cause_advice
from traceview.views.html.page import (
    Cell,
    Section,
    figure,
    legend,
    ms_cell,
    pct_cell,
    rich_html,
    table,
)
from traceview.views.html.svg import Bar, Part, Segment, bars, esc, heatmap, lanes
from traceview.views.style import (
    best_whatifs,
    change_words,
    failure_text,
    gpu_verdict_text,
    incomplete_text,
    pipeline_text,
    straggler_text,
    title_text,
    verdict_text,
    whole_run_text,
)

#: Ranks drawn one by one; past this the figures draw percentile rows and named ranks.
DRAWN_RANKS = 64
#: Steps drawn one by one in the per-step figure (past it: the slowest and a sample).
DRAWN_STEPS = 400
#: The heatmap's cells listed one by one up to this many (each a number in a folded table).
HEATMAP_CELLS = 20_000
PHASES = tuple(Breakdown.__struct_fields__)


def _parts(breakdown: Breakdown, who: str) -> list[Part]:
    step = breakdown.total() or 1.0
    return [
        Part(p, v, f"{who} · {p} {v:.2f} ms ({v / step:.0%})") for p, v in breakdown.items() if v
    ]


def verdict(report: RunReport) -> Section:
    """The verdict (the text report's words), the step time, and what would help most."""
    summary = report.summary
    out = [f'<p class="muted">{rich_html(title_text(report))}</p>']
    job = report.run.job
    if job is not None and job.command:
        code = "" if job.exit_code is None else f" · exit code {job.exit_code}"
        out.append(f'<p class="muted">job: <code>{esc(" ".join(job.command), 300)}</code>'
                   f"{code}</p>")  # fmt: skip
    said = failure_text(report)
    if said is not None:
        out.append(f'<div class="verdict" id="failure">{rich_html(said)}</div>')
    if report.ranks_at_end and (said is not None or any(
            r.state != "finished" for r in report.ranks_at_end)):  # fmt: skip
        ends = sorted(report.ranks_at_end, key=lambda r: (r.state == "finished", r.rank))
        out.append(table(
            ["rank", "step", "state", "in", "since s", "how it ended"],
            [[r.rank, r.last_step, r.state, r.in_ or "",
              Cell("" if r.since_s is None else f"{r.since_s:.1f}", r.since_s), r.detail or ""]
             for r in ends],
            name="ranks-at-end", caption="Where each rank was when the job ended",
        ))  # fmt: skip
    if report.ranks:
        out.append(f'<div class="verdict" id="headline">{rich_html(verdict_text(report))}</div>')
    gpu = gpu_verdict_text(report)
    if gpu is not None:
        out.append(f"<p>{rich_html(gpu)}</p>")
    whole = whole_run_text(report.whole_run)
    if whole is not None:
        out.append(f"<p>{rich_html(whole)}</p>")
    if report.incomplete_steps:
        out.append(f"<p>{rich_html(incomplete_text(report))}</p>")
    figures = (
        [("step time", summary.step_ms, "ms per step, mean of ranks", "step-ms")]
        if report.ranks else []
    )  # fmt: skip
    path = report.critical_path
    if path is not None and report.run.ranks > 1:
        figures.append(("job step", path.step_ms, "ms, first rank's start to last's end",
                        "job-step-ms"))  # fmt: skip
    if summary.comm_total_ms > 0:
        figures.append(("communication hidden", summary.comm_hidden_fraction * 100,
                        "% behind compute", "hidden"))  # fmt: skip
    big = "".join(
        f'<div class="figure-big" data-figure="{key}" data-v="{value!r}">{value:.2f}'
        f"<small>{esc(name)}: {esc(unit)}</small></div>"
        for name, value, unit, key in figures
    )
    out.append(f'<div class="headline">{big}</div>')
    out.append(_help(report))
    return Section("verdict", "Verdict", "".join(out))


def _help(report: RunReport) -> str:
    """What would help most: the cause's advice, then the replays that gain the most."""
    out = []
    cause = report.summary.cause
    if cause is not None:
        advice = cause_advice(cause, report.run.framework)
        line = f"<b>{esc(cause.text, 600)}</b>"
        out.append(f"<p>{line}" + (f"<br>try: {esc(advice, 600)}" if advice else "") + "</p>")
    useful = best_whatifs(report.whatif)
    if useful:
        items = "".join(
            f"<li>{esc(change_words(w.change))}: {w.step_ms:.2f} ms per step "
            f"({w.speedup:.2f}x)</li>"
            for w in useful
        )
        out.append(f"<p>What would help most, replayed on the counted steps:</p><ul>{items}</ul>")
    return "".join(out)


def breakdown(report: RunReport) -> Section:
    """The step by phase: the run's mean, each rank (or their spread), each step."""
    summary = report.summary
    out = [legend(PHASES)]
    run_rows = [[Cell(p, kind=p), ms_cell(v), pct_cell(v / (summary.step_ms or 1.0))]
                for p, v in summary.breakdown_ms.items()]  # fmt: skip
    run_rows.append([Cell("step"), ms_cell(summary.step_ms), pct_cell(1.0)])
    out.append(figure(
        bars([Bar("mean of ranks", _parts(summary.breakdown_ms, "mean of ranks"))],
             label="the step by phase, mean of ranks"),
        table(["phase", "ms", "share"], run_rows, name="breakdown",
              caption="Per step (exclusive, mean of ranks)"), side=True,
    ))  # fmt: skip
    out.append(_ranks(report))
    out.append(_steps(report))
    return Section("step", "The step by phase", "".join(out))


def _rank_table(report: RunReport) -> str:
    rows = [
        [r.rank, ms_cell(r.step_ms), *(ms_cell(v) for _, v in r.breakdown_ms.items()),
         ms_cell(r.busy_ms), ms_cell(r.comm_wait_ms), "yes" if r.straggler else ""]
        for r in sorted(report.ranks, key=lambda r: r.rank)
    ]  # fmt: skip
    return table(["rank", "step", *PHASES, "own work", "wait", "straggler"], rows,
                 name="ranks", caption="Per rank (ms per step)")  # fmt: skip


def _ranks(report: RunReport) -> str:
    ranks = sorted(report.ranks, key=lambda r: r.rank)
    if not ranks:
        return ""
    spread = report.rank_spread
    if len(ranks) <= DRAWN_RANKS or spread is None:
        drawn = [Bar(f"rank {r.rank}" + (" *" if r.straggler else ""),
                     _parts(r.breakdown_ms, f"rank {r.rank}")) for r in ranks]  # fmt: skip
        note = "* the straggler" if any(r.straggler for r in ranks) else ""
        return figure(bars(drawn, label="the step by phase, per rank"), _rank_table(report),
                      note=note)  # fmt: skip
    # many ranks: the percentiles of each phase, then the slowest and fastest by own work
    by_rank = {r.rank: r for r in ranks}
    rows = [
        Bar(name, [Part(p, getattr(s, key), f"{name} of ranks · {p} {getattr(s, key):.2f} ms")
                   for p, s in spread.breakdown_ms.items()])
        for name, key in (("p50", "p50"), ("p90", "p90"), ("max", "max"))
    ]  # fmt: skip
    named = [("slowest", r) for r in spread.slowest_ranks] + [
        ("fastest", r) for r in spread.fastest_ranks
    ]
    rows += [
        Bar(f"rank {r} ({which})", _parts(by_rank[r].breakdown_ms, f"rank {r}"))
        for which, r in named
        if r in by_rank
    ]
    spread_rows = [
        [name, *(ms_cell(getattr(spread.breakdown_ms[p], key)) for p in PHASES),
         ms_cell(getattr(spread.step_ms, key))]
        for name, key in (("p50", "p50"), ("p90", "p90"), ("max", "max"))
    ]  # fmt: skip
    return figure(
        bars(rows, label="the step by phase across ranks"),
        table(["", *PHASES, "step"], spread_rows, name="rank-spread",
              caption=f"{len(ranks)} ranks: each phase's percentiles (ms per step; a phase's "
              "p90 is not of the same rank as another's)"),
        f"<details><summary>every rank ({len(ranks)})</summary>{_rank_table(report)}</details>",
        note="p50, p90, max: each phase's percentile over the ranks (not one rank's); then the "
        "ranks with the most and the least own work",
    )  # fmt: skip


def _steps(report: RunReport) -> str:
    steps = report.per_step
    if not steps:
        return ""
    shown = steps
    if len(steps) > DRAWN_STEPS:  # the slowest, then evenly spaced others, in step order
        by_time = sorted(range(len(steps)), key=lambda i: -steps[i].step_ms)
        slow = set(by_time[: DRAWN_STEPS // 4])
        count = DRAWN_STEPS - len(slow)
        even = {round(k * (len(steps) - 1) / (count - 1)) for k in range(count)}
        shown = [steps[i] for i in sorted(slow | even)]
    rows = [
        Bar(f"step {s.step}" if s.step is not None else "window",
            _parts(s.breakdown_ms, f"step {s.step}"), faded=s.excluded is not None,
            note=s.excluded or ("slow" if s.mark == "slow" else ""))
        for s in shown
    ]  # fmt: skip
    table_rows = [
        [s.step, ms_cell(s.step_ms), ms_cell(s.min_ms), ms_cell(s.max_ms), s.slowest_rank,
         pct_cell(s.vs_median), s.excluded_reason or ("counted" if s.excluded is None else "")]
        for s in steps
    ]  # fmt: skip
    left_out = sum(1 for s in steps if s.excluded is not None)
    note = (f"{left_out} of {len(steps)} steps left out of the headline figures (drawn faded)"
            if left_out else f"all {len(steps)} steps counted")  # fmt: skip
    if len(shown) < len(steps):
        note += f"; {len(shown)} of them drawn (the slowest and an even sample), all in the table"
    return figure(
        bars(rows, label="the step by phase, per step (mean of ranks)"),
        table(["step", "ms", "min", "max", "slowest rank", "vs median", "counted"], table_rows,
              name="steps", caption="Per step (mean of ranks)"),
        note=note,
    )  # fmt: skip


def critical_path(report: RunReport) -> Section | None:
    path = report.critical_path
    if path is None or not path.segments:
        return None
    ranks = sorted({s.rank for s in path.segments})
    lane = {r: i for i, r in enumerate(ranks)}
    start = min(s.start_ms for s in path.segments)

    def kind(s: PathSegment) -> str:
        return s.phase if s.kind == "compute" and s.phase else s.kind

    segments = [
        Segment(lane[s.rank], s.start_ms - start, s.ms, kind(s),
                f"rank {s.rank} · {s.phase or ''} {s.kind} {s.ms:.2f} ms"
                + (f" · {s.op}" if s.op else ""))
        for s in path.segments
    ]  # fmt: skip
    total = max(s.start + s.length for s in segments)
    blame = [[b.rank, Cell(b.phase or "", kind=b.phase or ""), b.kind, ms_cell(b.ms),
              pct_cell(b.share), ms_cell(b.excess_ms)] for b in path.blame]  # fmt: skip
    ops = [[o.op, o.phase or "", o.kind, ms_cell(o.ms)] for o in path.by_op]
    kinds = sorted({s.kind for s in segments})
    body = [
        f"<p>The median step (step {esc(path.step)}): {path.step_ms:.2f} ms from the first "
        f"rank's start to the last rank's end; {path.complete_steps} of {path.steps} counted "
        "steps' paths explain every wait. Dashed lines: the path moves to another rank.</p>",
        legend(kinds),
        figure(
            lanes([f"rank {r}" for r in ranks], segments, total=total,
                  label="the median step's critical path across ranks"),
            table(["rank", "phase", "kind", "ms", "share", "over median"], blame,
                  name="blame", caption="On the path, mean per counted step"),
            table(["op", "phase", "kind", "ms"], ops, name="path-ops",
                  caption="Operators on the path") if ops else "",
            side=True,
        ),
    ]  # fmt: skip
    if report.summary.straggler_rank is not None:
        body.append(f"<p>{rich_html(straggler_text(report))}</p>")
    return Section("critical-path", "Critical path", "".join(body))


def communication(report: RunReport) -> Section | None:
    s = report.summary
    if s.comm_total_ms <= 0 and not report.comm_by_group:
        return None
    hidden = s.comm_total_ms - s.comm_exposed_ms
    rows = [Bar("all ranks", [
        Part("exposed", s.comm_exposed_ms, f"exposed {s.comm_exposed_ms:.2f} ms"),
        Part("hidden", hidden, f"hidden behind compute {hidden:.2f} ms")])]  # fmt: skip
    summary_rows = [["total", ms_cell(s.comm_total_ms)], ["exposed", ms_cell(s.comm_exposed_ms)],
                    ["hidden", ms_cell(hidden)], ["hidden share", pct_cell(s.comm_hidden_fraction)]]  # fmt: skip
    if s.comm_wait_total_ms is not None and s.comm_transfer_total_ms is not None:
        rows.append(Bar("inside the calls", [
            Part("wait", s.comm_wait_total_ms, f"waiting for the last rank {s.comm_wait_total_ms:.2f} ms"),
            Part("transfer", s.comm_transfer_total_ms, f"transfer {s.comm_transfer_total_ms:.2f} ms")]))  # fmt: skip
        summary_rows += [["waiting", ms_cell(s.comm_wait_total_ms)],
                         ["transfer", ms_cell(s.comm_transfer_total_ms)]]  # fmt: skip
    body = [legend(["exposed", "hidden", "wait", "transfer", "queued"]),
            figure(bars(rows, label="communication: exposed against hidden, waiting against "
                        "transfer"),
                   table(["", "ms per step"], summary_rows, name="comm",
                         caption="Communication per step (mean of ranks)"), side=True)]  # fmt: skip
    groups = report.comm_by_group
    if groups:

        def who(c: CommByGroup) -> str:
            return f"{c.group or 'default'} · {c.phase} · {c.op}"

        drawn = sorted(groups, key=lambda c: -c.total_ms)[:40]
        group_bars = [Bar(who(c), [
            Part("exposed", c.exposed_ms, f"{who(c)}: exposed {c.exposed_ms:.2f} ms"),
            Part("hidden", c.hidden_ms, f"{who(c)}: hidden {c.hidden_ms:.2f} ms")])
            for c in drawn]  # fmt: skip
        wait_bars = [Bar(who(c), [
            Part("wait", c.wait_ms, f"{who(c)}: waiting {c.wait_ms:.2f} ms"),
            Part("transfer", c.transfer_ms, f"{who(c)}: transfer {c.transfer_ms:.2f} ms"),
            Part("queued", c.queued_ms, f"{who(c)}: queued {c.queued_ms:.2f} ms")])
            for c in drawn]  # fmt: skip
        group_rows = [
            [c.group or "default", c.dim or "", c.phase, c.op, f"{c.calls_per_step:g}",
             ms_cell(c.total_ms), ms_cell(c.exposed_ms), ms_cell(c.hidden_ms),
             ms_cell(c.wait_ms), ms_cell(c.transfer_ms), ms_cell(c.queued_ms)]
            for c in groups
        ]  # fmt: skip
        note = (
            f"the {len(drawn)} largest of {len(groups)} drawn" if len(drawn) < len(groups) else ""
        )
        body.append(figure(
            bars(group_bars, label="communication by group and phase: exposed against hidden")
            + bars(wait_bars, label="communication by group and phase: waiting against transfer"),
            table(["group", "dim", "phase", "op", "calls", "total", "exposed", "hidden", "wait",
                   "transfer", "queued"], group_rows, name="comm-by-group",
                  caption="By group, phase and collective (ms per step)"),
            note=note,
        ))  # fmt: skip
    return Section("communication", "Communication", "".join(body))


def heatmap_section(report: RunReport, matrix: StepMatrix | None) -> Section | None:
    if matrix is None or not matrix.steps or not matrix.ranks:
        return None
    columns = ["" if s is None else str(s) for s in matrix.steps]
    if len(matrix.ranks) <= DRAWN_RANKS:
        names = [f"rank {r}" for r in matrix.ranks]
        values = [row_of(matrix, r) for r in matrix.ranks]
        note = "each cell: the rank's step time in that step"
    else:  # percentile rows over the ranks, then the slowest ranks by own work
        spread = report.rank_spread
        slowest = [r for r in (spread.slowest_ranks if spread else []) if r in matrix.ranks]
        drawn = bands(matrix)
        names = [f"{b} of ranks" for b in drawn] + [f"rank {r} (slowest)" for r in slowest]
        values = list(drawn.values()) + [row_of(matrix, r) for r in slowest]
        note = (f"{len(matrix.ranks)} ranks: per step, the p50, p90 and max of the ranks' step "
                "time, then the ranks with the most own work")  # fmt: skip
    svg = heatmap(names, columns, values, low=matrix.low_ms["step"], high=matrix.high_ms["step"],
                  label="ranks by steps: step time")  # fmt: skip
    rows = []
    for name, row in zip(names, values, strict=True):
        low, mid, high = extremes(row) or (None, None, None)
        rows.append([name, ms_cell(low), ms_cell(mid), ms_cell(high)])
    cells = ""
    if len(names) * len(columns) <= HEATMAP_CELLS:  # every cell's number, folded away
        grid = [[name, *(ms_cell(None if math.isnan(v) else v) for v in row)]
                for name, row in zip(names, values, strict=True)]  # fmt: skip
        cells = (f"<details><summary>every cell ({len(names)} × {len(columns)})</summary>"
                 + table(["row", *columns], grid, name="heatmap-cells",
                         caption="Step time (ms) by row and step") + "</details>")  # fmt: skip
    return Section("heatmap", "Ranks × steps", figure(
        svg, "<div>" + table(["row", "min", "median", "max"], rows, name="heatmap",
                             caption="Step time over the steps (ms)") + cells + "</div>", note=note,
        side=True))  # fmt: skip


def pipeline(report: RunReport) -> Section | None:
    p = report.pipeline
    if p is None:
        return None
    rows = [Bar(f"stage {s.stage}", [
        Part("compute", s.compute_ms, f"stage {s.stage}: compute {s.compute_ms:.2f} ms"),
        Part("bubble", s.bubble_ms, f"stage {s.stage}: bubble {s.bubble_ms:.2f} ms")])
        for s in sorted(p.stages, key=lambda s: s.stage)]  # fmt: skip
    table_rows = [[s.stage, ", ".join(map(str, s.ranks)), ms_cell(s.compute_ms),
                   ms_cell(s.bubble_ms), ms_cell(s.transfer_ms)]
                  for s in sorted(p.stages, key=lambda s: s.stage)]  # fmt: skip
    body = (f"<p>{rich_html(pipeline_text(p))}</p>" + legend(["compute", "bubble"])
            + figure(bars(rows, label="pipeline stages: compute and bubble"),
                     table(["stage", "ranks", "compute", "bubble", "transfer"], table_rows,
                           name="pipeline", caption=f"{p.schedule}, {p.microbatches:g} "
                           f"micro-batches, bubble {p.bubble_fraction:.0%}"
                           + (f" (ideal {p.ideal_bubble_fraction:.0%})"
                              if p.ideal_bubble_fraction is not None else ""))))  # fmt: skip
    return Section("pipeline", "Pipeline", body)


def memory(report: RunReport) -> Section | None:
    run = report.summary.memory
    kept = [r for r in sorted(report.ranks, key=lambda r: r.rank) if r.memory is not None]
    if run is None or not kept:
        return None
    drawn = kept
    if len(kept) > DRAWN_RANKS:  # the highest peaks
        drawn = sorted(kept, key=lambda r: -(r.memory.peak_mb or 0.0))[:16]  # type: ignore[union-attr]
    rows = []
    for r in drawn:
        m = r.memory
        assert m is not None
        peak = m.peak_mb or 0.0
        parts = [Part("peak", peak, f"rank {r.rank}: peak {peak:.1f} MiB in {m.peak_phase or '?'}")]
        if m.reserved_peak_mb and m.reserved_peak_mb > peak:
            extra = m.reserved_peak_mb - peak
            parts.append(
                Part("reserved", extra, f"rank {r.rank}: reserved {m.reserved_peak_mb:.1f} MiB")
            )
        rows.append(Bar(f"rank {r.rank}", parts, note=m.peak_phase or ""))
    table_rows = [
        [r.rank, r.memory.device, Cell(f"{r.memory.peak_mb:.1f}" if r.memory.peak_mb is not None else "",
                                       r.memory.peak_mb),
         Cell(r.memory.peak_phase or "", kind=r.memory.peak_phase or ""), r.memory.peak_op or "",
         r.memory.peak_step,
         Cell(f"{r.memory.reserved_peak_mb:.1f}" if r.memory.reserved_peak_mb is not None else "",
              r.memory.reserved_peak_mb),
         Cell(f"{r.memory.growth_mb_per_step:.2f}" if r.memory.growth_mb_per_step is not None else "",
              r.memory.growth_mb_per_step)]
        for r in kept if r.memory is not None
    ]  # fmt: skip
    words = f"peak {run.peak_mb:.1f} MiB on rank {run.peak_rank} ({esc(run.device)})"
    if run.excess_mb is not None and run.median_mb is not None:
        words += f", {run.excess_mb:.1f} MiB over the others' median of {run.median_mb:.1f} MiB"
    if run.leaking_ranks:
        words += f"; growing step after step on rank(s) {', '.join(map(str, run.leaking_ranks))}"
    body = (f"<p>{words}</p>" + legend(["peak", "reserved"])
            + figure(bars(rows, label="memory per rank", unit="MiB"),
                     table(["rank", "device", "peak MiB", "in phase", "op", "step",
                            "reserved MiB", "growth MiB/step"], table_rows, name="memory",
                           caption="Memory per rank (its main device)")))  # fmt: skip
    return Section("memory", "Memory", body)


def whatif(report: RunReport) -> Section | None:
    if len(report.whatif) < 2:
        return None
    ordered = sorted(report.whatif, key=lambda w: (w.change != "none", w.step_ms))
    rows = [Bar(change_words(w.change) if w.change != "none" else "as measured (replayed)",
                [Part("baseline" if w.change == "none" else "step", w.step_ms,
                      f"{change_words(w.change)}: {w.step_ms:.2f} ms ({w.speedup:.2f}x)")],
                note=f"{w.speedup:.2f}x") for w in ordered]  # fmt: skip
    table_rows = [[w.change, change_words(w.change), ms_cell(w.step_ms),
                   Cell(f"{w.speedup:.2f}x", w.speedup), w.last_rank] for w in ordered]  # fmt: skip
    return Section("whatif", "What if", figure(
        bars(rows, label="what-ifs: predicted step time"),
        table(["change", "in words", "step ms", "speedup", "last rank"], table_rows,
              name="whatif", caption="The counted steps replayed with one change"),
        note="the replay with no change first; each bar: the predicted job step"))  # fmt: skip


def operators(report: RunReport) -> Section | None:
    if not report.top_ops:
        return None
    by_phase: dict[str, list] = defaultdict(list)
    for op in report.top_ops:
        by_phase[op.phase].append(op)
    rows = [Bar(op.op, [Part(op.phase, op.self_ms_per_step,
                             f"{op.op} ({op.phase}, {op.device}): {op.self_ms_per_step:.2f} ms self "
                             f"per step, {op.calls_per_step:g} calls")])
            for phase in PHASES for op in by_phase.get(phase, [])]  # fmt: skip
    table_rows = [[op.op, Cell(op.phase, kind=op.phase), op.device, f"{op.calls_per_step:g}",
                   ms_cell(op.self_ms_per_step), ms_cell(op.total_ms_per_step),
                   pct_cell(op.share), op.name] for op in report.top_ops]  # fmt: skip
    return Section("operators", "Top operators", legend(list(by_phase)) + figure(
        bars(rows, label="top operators by phase: self time per step"),
        table(["op", "phase", "on", "calls", "self ms", "total ms", "share", "name in the trace"],
              table_rows, name="operators", caption="Per counted step, grouped by phase in the "
              "figure")))  # fmt: skip


def servers(report: RunReport) -> Section | None:
    """A parameter-server job's workers and the processes that serve them."""
    if report.run.architecture != "parameter_server":
        return None
    mode = {True: "synchronous", False: "asynchronous"}.get(report.run.synchronous)  # type: ignore[arg-type]
    workers = table(
        ["rank", "step ms", "steps/s", "busy", "gap ms", "wait ms", "unseen updates a step"],
        [
            [r.rank, r.step_ms, r.steps_per_s, r.busy_fraction, r.gap_ms, r.comm_wait_ms,
             r.staleness]
            for r in report.ranks
        ],
        name="workers",
    )  # fmt: skip
    served = table(
        ["rank", "role", "host", "updates", "ms an update", "sums", "busy", "bottleneck"],
        [
            [s.rank, s.role, s.host, s.updates, s.update_ms, s.sums, s.busy_fraction,
             "yes" if s.bottleneck else ""]
            for s in report.servers
        ],
        name="servers",
    )  # fmt: skip
    how = f'<p class="muted">{esc(report.run.architecture_from or "", 300)}</p>'
    return Section(
        "servers", f"Parameter servers ({mode or 'synchrony not known'})", workers + served + how
    )


def warnings(report: RunReport) -> Section | None:
    if not report.warnings and not report.remarks:
        return None
    items = "".join(f"<li>warning: {esc(w, 2000)}</li>" for w in report.warnings)
    items += "".join(f'<li class="muted">note: {esc(r, 2000)}</li>' for r in report.remarks)
    return Section("warnings", "Warnings and notes", f'<ul class="warnings">{items}</ul>')
