"""What the text report and the TUI share: phase colours and letters, numbers, the verdicts in
words. One wording for each verdict, so the two views cannot say different things.

Everything from a trace goes through ``safe`` into a ``Text`` (never a markup string), so names
are shown literally and no control character reaches the terminal.
"""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from traceview.model import vocabulary as S
from traceview.model.escape import safe
from traceview.model.results import (
    Blame,
    Breakdown,
    FsdpGather,
    HostBound,
    KernelLaunches,
    Pipeline,
    PipelineStage,
    RankGpu,
    RunReport,
    WhatIf,
    WholeRun,
)
from traceview.model.results.steps import incomplete_reason
from traceview.views.advice import cause_advice, gpu_advice

PHASE_STYLE = {
    S.IO: "magenta",
    S.H2D: "cyan",
    S.FORWARD: "green",
    S.BACKWARD: "blue",
    S.UPDATE: "yellow",
    S.COMM: "red",
    S.OTHER: "white",
    S.IDLE: "bright_black",
    "imbalance": "bold red",  # a verdict, not a phase: most communication is waiting
    "pipeline": "bold red",  # a verdict: a pipeline's stages wait on each other (bubble)
    "dispatch": "bold red",  # a verdict: workers idle between a coordinator's closures
}
#: Column headers short enough for an 80-column terminal.
SHORT = {
    S.IO: "io",
    S.H2D: "h2d",
    S.FORWARD: "fwd",
    S.BACKWARD: "bwd",
    S.UPDATE: "upd",
    S.COMM: "comm",
    S.OTHER: "other",
    S.IDLE: "idle",
}
#: One letter per phase, so the breakdown reads without colour too.
PHASE_LETTER = {
    S.IO: "I",
    S.H2D: "H",
    S.FORWARD: "F",
    S.BACKWARD: "B",
    S.UPDATE: "U",
    S.COMM: "C",
    S.OTHER: "o",
    S.IDLE: ".",
}


def ms(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.1f}"


def pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def signed_pct(value: float) -> str:
    return f"{100 * value:+.0f}%"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


#: Warnings (or notes) a screen lists before it counts the rest: 20,000 damaged files must not
#: print 20,000 lines (the JSON and the manifest keep every one).
NOTES_SHOWN = 10


def shown_notes(items: list[str], noun: str = "warning", limit: int = NOTES_SHOWN) -> list[str]:
    """The first ``limit`` of ``items``, then one line that counts the rest."""
    if len(items) <= limit:
        return list(items)
    rest = len(items) - limit
    return [*items[:limit], f"… and {count(rest, 'more ' + noun)} (report --json lists them all)"]


def untrusted(value: object, limit: int | None = None, style: str = "") -> Text:
    """A name from a trace, shown literally: controls escaped, markup not interpreted."""
    return Text(safe(value, limit), style=style, no_wrap=True, overflow="ellipsis")


def phase_text(phase: str, short: bool = False) -> Text:
    label = SHORT.get(phase, phase) if short else phase
    return Text(label, style=PHASE_STYLE.get(phase, ""))


def phase_bar(breakdown: Breakdown, width: int) -> Text:
    """A stacked bar of the breakdown: coloured, and lettered so it reads in monochrome."""
    total = breakdown.total()
    bar = Text()
    if total <= 0 or width <= 0:
        return bar
    cells, acc = 0, 0.0
    for phase, value in breakdown.items():
        acc += value
        end = round(acc / total * width)
        if end > cells:
            bar.append(PHASE_LETTER[phase] * (end - cells), style=f"reverse {PHASE_STYLE[phase]}")
            cells = end
    return bar


def legend_text(phases: tuple[str, ...] = S.BREAKDOWN_PHASES) -> Text:
    """One letter per phase, coloured as in the bars: the key to read them without colour."""
    text = Text()
    for i, phase in enumerate(phases):
        if i:
            text.append("  ")
        text.append(PHASE_LETTER[phase], style=f"reverse {PHASE_STYLE[phase]}")
        text.append(f" {phase}")
    return text


def ratio_text(ratio: float | None) -> Text:
    """A ratio against the baseline; slower (at least 1.1×) red, faster green, so the eye finds
    the differences; "-" where the baseline has none, "absent" where this run has none."""
    if ratio is None:
        return Text("-", style="bright_black")
    if ratio == 0:
        return Text("absent", style="bright_black")
    style = "red" if ratio >= 1.1 else "green" if ratio <= 1 / 1.1 else ""
    return Text(f"×{ratio:.2f}", style=style)


def duration_us(us: float) -> str:
    """A duration given in µs, in µs, ms or s, whichever reads best."""
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3g} s"
    return f"{us / 1e3:.3g} ms" if abs(us) >= 1e3 else f"{us:.3g} µs"


def device_kind(report: RunReport) -> str | None:
    """The kind of device the ranks are, where each is a device of a process that drove
    several and all are of one kind (CPU, TPU: not a GPU's device timeline); else None."""
    kinds = {r.device.rpartition(":")[0] for r in report.ranks if r.device}
    kind = kinds.pop() if len(kinds) == 1 else None
    return kind if kind and kind.upper() != "GPU" else None


def timeline_words(report: RunReport) -> str:
    """``gpu timeline``; the devices' kind where they are not GPUs (``CPU device timeline``)."""
    timeline = report.run.timeline or "?"
    kind = device_kind(report) if timeline == "gpu" else None
    return f"{safe(kind)} device timeline" if kind else f"{timeline} timeline"


def title_text(report: RunReport, label: str | None = None) -> Text:
    run = report.run
    text = Text("traceview", style="bold")
    if label is not None:
        text.append(" · ")
        text.append(safe(label, 40))
    of_world = f" of {run.world_size}" if run.world_size and run.world_size != run.ranks else ""
    who = f"{count(run.ranks, 'rank')}{of_world}"
    if run.architecture == "parameter_server":
        mode = {True: "synchronous", False: "asynchronous"}.get(run.synchronous, "sync unknown")  # type: ignore[arg-type]
        roles = Counter(s.role for s in report.servers)
        served = "".join(f", {count(n, role)}" for role, n in sorted(roles.items()))
        who = f"parameter server ({mode}) · {count(run.ranks, 'worker')}{served}"
    text.append(
        f" · {safe(run.framework or '?')} · {who}"
        f" · {count(run.steps, 'step')}{_counted(report)} · {timeline_words(report)}"
    )
    return text


def _counted(report: RunReport) -> str:
    """ " (2 counted)" where the selection leaves steps out of the figures; "one window" where
    the run has no steps (no markers, nothing repeats)."""
    if report.run.steps_from == "one_window":
        return " (one window)"
    left_out = sum(1 for s in report.per_step if s.excluded is not None)
    return f" ({len(report.per_step) - left_out} counted)" if left_out else ""


def verdict_text(report: RunReport) -> Text:
    """Where the time goes, in words: the bottleneck, how much communication is hidden, and
    how much of the exposed part is transfer and how much waiting for a straggler."""
    summary = report.summary
    bottleneck = summary.bottleneck
    if bottleneck is None:
        return Text("no phase time found in this run")
    text = Text()
    if report.run.steps_from == "one_window":  # no step: no bottleneck of one
        text.append("one window, no steps", style="bold")
        text.append(
            f": {bottleneck} is the largest share ({pct(summary.bottleneck_share)}) of the "
            f"{ms(summary.step_ms)} ms traced, one-time startup costs included"
        )
        return text
    text.append_text(cause_text(report))
    pipeline = report.pipeline
    if bottleneck == "pipeline" and pipeline is not None:
        return text.append_text(pipeline_verdict(report, pipeline))
    text.append(bottleneck, style=f"bold {PHASE_STYLE[bottleneck]}")
    # (with a cause, its share is of the job's step its replay starts from)
    job_step = summary.cause.step_ms + summary.cause.ms if summary.cause is not None else 0.0
    if bottleneck == "imbalance" and summary.cause is not None:
        text.append(
            f" is the bottleneck: {pct(summary.bottleneck_share)} of the {ms(job_step)} ms job "
            "step (first rank's start to last rank's end) is lost to waiting for another rank"
        )
    elif bottleneck == "dispatch":
        text.append(
            f" is the bottleneck: the workers idle {pct(summary.bottleneck_share)} of their "
            "time between the steps their coordinator hands them"
        )
    elif bottleneck == "imbalance":
        text.append(
            f" is the bottleneck: {pct(summary.bottleneck_share)} of the "
            f"{ms(summary.step_ms)} ms step is waiting in communication for another rank"
        )
    elif summary.cause is not None and report.run.synchronous is not False:
        # (the share is what the cause's replay saves, not the phase's own share of the step,
        # which the per-step table shows: both named, so the two figures do not read as one)
        text.append(
            f" is the bottleneck: {pct(summary.bottleneck_share)} of the {ms(job_step)} ms job step"
        )
        if bottleneck in S.BREAKDOWN_PHASES and summary.step_ms > 0:
            own = summary.breakdown_ms[bottleneck] / summary.step_ms
            text.append(
                f" goes to the cause above ({bottleneck} itself: {pct(own)} of the step, "
                "mean of ranks)"
            )
    else:
        text.append(
            f" is the bottleneck: {pct(summary.bottleneck_share)} of the "
            f"{ms(summary.step_ms)} ms step"
        )
    if summary.hidden != "n/a":  # the analysis found communication (from ns, not rounded ms)
        text.append(
            f"; communication {ms(summary.comm_total_ms)} ms per step, "
            f"{pct(summary.comm_hidden_fraction)} of it hidden behind compute "
            f"(hidden: {summary.hidden})"
        )
    else:
        text.append("; no communication found")
    if summary.comm_wait_ms is not None and summary.comm_exposed_ms > 0:
        text.append(f". Exposed: {ms(summary.comm_transfer_ms or 0)} ms transfer, ")
        text.append(f"{ms(summary.comm_wait_ms)} ms waiting")
        if summary.straggler_significant and summary.straggler_rank is not None:
            text.append(f" for rank {summary.straggler_rank}")
            if summary.straggler_phase is not None:
                text.append(
                    f", whose {summary.straggler_phase} takes "
                    f"{ms(summary.straggler_phase_ms or 0)} ms against a median of "
                    f"{ms(summary.straggler_phase_median_ms or 0)} ms"
                )
        else:
            text.append(" for other ranks")
    return text


def cause_text(report: RunReport) -> Text:
    """The cause the critical path and its replays find (``summary.cause``), as the headline's
    first line; where there is none on a run of several ranks with a critical path, that the run
    is balanced. Empty where the run has no critical path."""
    cause = report.summary.cause
    if cause is not None:
        text = Text("cause: ", style="bold")
        text.append(safe(cause.text))  # (made in the analysis, trace names already safe)
        advice = cause_advice(cause, report.run.framework)
        if advice:
            text.append("\ntry: ", style="bold")
            text.append(advice)
        return text.append("\n")
    if report.critical_path is None or report.run.ranks < 2:
        return Text()
    path = report.critical_path
    # (cause.pick's floors: a rank's cause 5% of the step, the whole run's 10%, and either
    # more than the counted steps vary)
    spread = (
        f"more than the steps vary (±{ms(path.noise_ms)} ms) and "
        if path.noise_ms > 0.05 * path.step_ms
        else ""
    )
    floors = f"{spread}5% of the step (10% for a cause of the whole run), replayed without it"
    if not path.explained:  # (only a rank's own timeline was read)
        return Text(
            "no cause named: most counted steps' critical paths are incomplete, and nothing a "
            f"rank's own timeline tells saves {floors}; incomplete: "
            f"{incomplete_reason(report.per_step)}\n",
            style="bright_black",
        )
    if report.summary.bottleneck == "pipeline":  # (the stages' own rule names the slow one)
        return Text(
            "no cause stands out on the critical path: nothing saves 5% of the step, replayed "
            "without it; the pipeline's stages below\n",
            style="bright_black",
        )
    return Text(f"balanced: nothing on the critical path saves {floors}\n", style="bright_black")


def pipeline_verdict(report: RunReport, pipeline: Pipeline) -> Text:
    """A pipeline's bubble in words: which stage waits most, for which, and why."""
    text = Text()
    text.append("pipeline bubble", style=f"bold {PHASE_STYLE['pipeline']}")
    waiting = max(pipeline.stages, key=lambda s: s.bubble_ms)
    slow = next(s for s in pipeline.stages if s.stage == pipeline.slowest_stage)
    step = report.summary.step_ms

    def named(stage: PipelineStage) -> str:
        """A stage, and where a rank holds several (virtual stages), its rank."""
        if pipeline.virtual_stages <= 1:
            return f"stage {stage.stage}"
        return (
            f"stage {stage.stage} (rank{'s' if len(stage.ranks) > 1 else ''} "
            + ", ".join(map(str, stage.ranks[:4]))
            + (" ..." if len(stage.ranks) > 4 else "")
            + ")"
        )

    # (the stages of one rank wait together: the rank is blocked, not one of its stages)
    blocked = "rank " + str(waiting.ranks[0]) if pipeline.virtual_stages > 1 else named(waiting)
    text.append(
        f" is the bottleneck: {pct(pipeline.bubble_fraction)} of the stages' time "
        f"(ideal for equal stages: {ideal_share(pipeline)}); {blocked} is blocked "
        f"{pct(waiting.bubble_ms / step if step else 0)} of the {ms(step)} ms step"
    )
    if slow.ranks != waiting.ranks and report.summary.straggler_significant:
        text.append(f" waiting for {named(slow)}")
        if pipeline.slowest_phase is not None and pipeline.slowest_phase_ratio:
            text.append(
                f", whose {pipeline.slowest_phase} takes {pipeline.slowest_phase_ratio:g}× "
                "the other stages' median"
            )
    return text


def ideal_share(pipeline: Pipeline) -> str:
    """The schedule's ideal bubble share, or "n/a" where it has none (zero bubble)."""
    ideal = pipeline.ideal_bubble_fraction
    return pct(ideal) if ideal is not None else "n/a"


def pipeline_text(pipeline: Pipeline) -> Text:
    """The stages, one line each."""
    p = len(pipeline.stages)
    untraced = pipeline.untraced
    without = (
        f" (stage{'s' if len(untraced) > 1 else ''} {', '.join(map(str, untraced[:8]))}"
        f"{' ...' if len(untraced) > 8 else ''} without a trace)"
        if untraced
        else ""
    )
    per_rank = f", {pipeline.virtual_stages} stages per rank" if pipeline.virtual_stages > 1 else ""
    text = Text(
        f"pipeline: {pipeline.depth} stages{without} × {pipeline.microbatches:g} micro-batches "
        f"({pipeline.schedule}{per_rank}); "
        f"bubble {pct(pipeline.bubble_fraction)} of the stages' time, ideal for equal stages "
        f"{ideal_share(pipeline)}"
        + ("; a stage's bubble is its rank's" if pipeline.virtual_stages > 1 else "")
    )
    for s in pipeline.stages[:16]:
        ranks = ", ".join(str(r) for r in s.ranks[:8]) + (" ..." if len(s.ranks) > 8 else "")
        text.append(
            f"\n  stage {s.stage} (rank{'s' if len(s.ranks) > 1 else ''} {ranks}): compute "
            f"{ms(s.compute_ms)} ms, bubble {ms(s.bubble_ms)} ms (messages moving "
            f"{ms(s.transfer_ms)} ms)" + (" ← slowest" if s.stage == pipeline.slowest_stage else "")
        )
    if p > 16:
        text.append(f"\n  ... {p - 16} more stages")
    return text


def change_words(change: str) -> str:
    """A what-if's change (WhatIf.change) in words."""
    name, _, rest = change.partition(":")
    if name == "balance" and rest.startswith("stage="):
        return f"stage {rest.removeprefix('stage=')} at the median of the other stages"
    if name == "balance":
        return (
            f"rank {rest.removeprefix('rank=')} at the median of the others"
            if rest
            else ("every rank at the median")
        )
    if name == "faster":
        what, _, k = rest.rpartition(":")
        return f"{safe(what)} {k}x faster"
    if name == "bandwidth":
        op, _, gbps = rest.rpartition(":")
        return f"{safe(op)} at {gbps} Gb/s"
    if name == "without" and rest:
        what, _, rank = rest.partition(":rank=")
        return f"without rank {rank}'s {safe(what)}" if rank else f"without {safe(what)}"
    if name == "no_late_start" and rest:
        return f"rank {rest.removeprefix('rank=')} starting each step with the first"
    return {"hide_comm": "communication hidden", "no_late_start": "no late starts"}.get(
        name, safe(change)
    )


def blame_words(b: Blame) -> str:
    """One line of blame: who, in what, how long (ms per step)."""
    if b.kind == "late_start":
        what = "starting the step late"
    elif b.kind == "transfer":
        what = "communication (transfer)"
    elif b.kind == "idle":
        what = "idle"
    elif b.kind == S.SEGMENT_LAUNCH:
        what = f"{b.phase} (launching kernels)"
    else:
        what = f"{b.phase} ({b.kind.replace('_', '-')})"
    extra = ""
    if b.excess_ms is not None and b.kind != "late_start" and b.excess_ms >= 0.05 * b.ms > 0:
        extra = f", {ms(b.excess_ms)} ms over the median rank"
    return f"{ms(b.ms):>8} ms  rank {b.rank} {what}{extra}"


def best_whatifs(whatif: list[WhatIf], n: int = 3) -> list[WhatIf]:
    """The what-ifs that gain the most (the replay with no change left out)."""
    useful = [w for w in whatif if w.change != "none" and w.speedup > 1.0]
    return sorted(useful, key=lambda w: (-w.speedup, w.change))[:n]


def critical_path_text(report: RunReport, rows: int = 5) -> Text | None:
    """The critical path in words: who holds the step, and what would make it faster."""
    path = report.critical_path
    if path is None or report.run.ranks < 2:
        return None
    text = Text(
        f"critical path: {ms(path.step_ms)} ms (median step, first rank's start to last "
        f"rank's end); on it, per step:"
    )
    for b in path.blame[:rows]:
        text.append("\n  " + blame_words(b))
    if path.complete_steps < path.steps:
        reasons = Counter(
            s.critical_path.reason
            for s in report.per_step
            if s.excluded is None and s.critical_path is not None and s.critical_path.reason
        )
        why = reasons.most_common(1)[0][0] if len(reasons) == 1 else "see per_step in --json"
        text.append(
            f"\n  ({path.steps - path.complete_steps} of {path.steps} steps' paths incomplete: "
            f"{why})",
            style="bright_black",
        )
    best = best_whatifs(report.whatif)
    if best:
        words = "; ".join(
            f"{change_words(w.change)} → {ms(w.step_ms)} ms ({w.speedup:.2f}x)" for w in best
        )
        text.append(f"\nwhat if (replayed): {words}")
    return text


def dimension_comm_text(report: RunReport, dim: str) -> Text:
    """What one dimension of the job costs: its groups' communication by collective and issuing
    phase (means over its groups, ms per step), or for ``stage`` the pipeline's bubble."""
    if dim == "stage" and report.pipeline is not None:
        return Text(pipeline_text(report.pipeline).plain.split("\n", 1)[0])
    rows = [c for c in report.comm_by_group if c.dim == dim]
    text = Text(f"{dim} groups' communication (ms per step, mean of the groups): ", style="")
    text.stylize("bold", 0, len(dim))
    if not rows:
        text.append("none matched across ranks")
        return text
    by_kind: dict[tuple[str, str], list[float]] = {}
    for c in rows:
        kind = by_kind.setdefault((c.op, c.phase), [0.0, 0.0, 0.0])
        kind[0] += c.total_ms
        kind[1] += c.hidden_ms
        kind[2] += 1
    for i, ((op, phase), (total, hidden, groups)) in enumerate(
        sorted(by_kind.items(), key=lambda kv: -kv[1][0])
    ):
        if i:
            text.append(" · ")
        text.append_text(untrusted(op, 40))
        hidden_share = hidden / total if total else 0.0
        text.append(f" in {phase} {ms(total / groups)} ms, {pct(hidden_share)} hidden")
    return text


def communication_text(report: RunReport) -> Text:
    summary = report.summary
    if summary.hidden == "n/a":
        return Text("communication: none found")
    text = Text(
        f"communication: total {ms(summary.comm_total_ms)} ms per step, exposed "
        f"{ms(summary.comm_exposed_ms)} ms, hidden {pct(summary.comm_hidden_fraction)}"
        "  →  hidden: "
    )
    text.append(summary.hidden, style="bold")
    if summary.comm_wait_total_ms is not None:
        text.append(
            f"; of the total, {ms(summary.comm_transfer_total_ms or 0)} ms transfer and "
            f"{ms(summary.comm_wait_total_ms)} ms waiting for the last rank to arrive"
        )
    return text


def failure_text(report: RunReport, frames: int = 4) -> Text | None:
    """What went wrong first in a job that failed (``report.failure``): its sentence, the
    failing rank's innermost ``frames``, and the evidence followed; None for a run that did not
    fail. Every name in it comes from the job: escaped, never read as markup (it wraps)."""
    failure = report.failure
    if failure is None:
        return None
    text = Text(f"{failure.kind}: {safe(failure.detail, 800)}", style="bold red")
    for f in failure.stack[-frames:]:
        where = f"{safe(f.file.rsplit('/', 1)[-1], 80)}:{f.line} in {safe(f.function, 80)}"
        code = f"   {safe(f.code, 120)}" if f.code else ""
        text.append(f"\n    {where}{code}", style="bright_black")
    if failure.evidence:
        text.append(f"\n  (from {safe(failure.evidence, 400)})", style="bright_black")
    return text


def whole_run_text(run: WholeRun | None) -> Text | None:
    """The whole run from the step record, in one line: its steps and step time, where the step
    time moved, the slowest rank and the slow steps; None without a record."""
    if run is None or not run.steps:
        return None
    span = f"steps {run.first_step}-{run.last_step}" if run.first_step is not None else ""
    text = Text(f"whole run: {run.steps} steps ({span})", style="bright_black")
    if run.step_ms_p50 is not None:
        text.append(f", {run.step_ms_p50:.2f} ms median, p99 {run.step_ms_p99 or 0:.2f} ms")
    for change in run.changes[:3]:
        who = f" (rank {change.rank})" if change.rank is not None else ""
        text.append(
            f"; from step {change.step} {change.ms_before:.2f} → {change.ms_after:.2f} ms{who}"
        )
    if run.slowest_rank is not None:
        text.append(f"; slowest rank {run.slowest_rank}")
    if run.slow_steps:
        some = ", ".join(
            f"{s.step} ({s.ms:.1f} ms"
            + (f", profile window {s.window}'s" if s.window is not None else "")
            + ")"
            for s in run.slow_steps[:4]
        )
        more = " ..." if len(run.slow_steps) > 4 else ""
        text.append(f"; {len(run.slow_steps)} slow step(s): {some}{more}")
    return text


def _ranks_named(ranks: list[int]) -> str:
    more = " ..." if len(ranks) > 8 else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks[:8]))}{more}"


def incomplete_text(report: RunReport, limit: int = 5) -> Text:
    """The steps that did not complete on every rank, which every figure leaves out."""
    text = Text()
    steps = report.incomplete_steps
    for i, step in enumerate(steps[:limit]):
        if i:
            text.append("\n")
        untraced = set(step.untraced_ranks)
        cut = [r for r in step.unfinished_ranks if r not in untraced]
        said = []
        if cut:
            said.append(f"did not finish on {_ranks_named(cut)}")
        if untraced:
            said.append(f"is not in the traces of {_ranks_named(sorted(untraced))}")
        text.append(f"step {step.step} {' and '.join(said)}", style="yellow")
        if step.waited_rank is not None:
            text.append(
                f": rank {step.waited_rank} was blocked {ms(step.waited_ms)} ms in it "
                "(communication and idle)"
            )
        text.append("; left out of every figure", style="bright_black")
    if len(steps) > limit:
        text.append(f"\n... and {len(steps) - limit} more (--json)", style="bright_black")
    return text


#: A rank the others wait for this share of the step is said to be waited for, even where no
#: change to it replays to a saving (the critical path names no straggler); below it, a busy
#: machine's turns (3 balanced ranks on 2 cores: up to 11% seen)
STRAGGLER_WAIT_SAID = 0.2


def straggler_text(report: RunReport) -> Text:
    summary = report.summary
    rank = summary.straggler_rank
    if rank is None:
        what = "one rank, none to compare" if report.run.ranks == 1 else "no rank has steps"
        return Text(f"straggler: {what}", style="bright_black")
    excess = summary.straggler_excess
    text = Text("straggler: ")
    waited = summary.straggler_wait_ms
    if summary.straggler_significant:
        text.append(f"rank {rank}", style="bold reverse")
        if waited is not None:
            text.append(f" (the others wait for it {ms(waited)} ms per step")
            if summary.straggler_phase is not None:
                text.append(
                    f"; its {summary.straggler_phase} takes {ms(summary.straggler_phase_ms or 0)}"
                    f" ms against a median of {ms(summary.straggler_phase_median_ms or 0)} ms"
                )
            text.append(")")
        else:
            text.append(f" (busy {pct(excess)} longer than the median rank)")
    elif summary.straggler_significant is None:  # nothing matched across ranks: no claim
        return Text(
            f"straggler: not known (no collective calls matched across ranks); the busiest rank "
            f"is {rank}, {pct(excess)} above the median",
            style="bright_black",
        )
    else:
        text.append(f"rank {rank}", style="bold")
        step = summary.step_ms
        if waited is not None and step > 0 and waited >= STRAGGLER_WAIT_SAID * step:
            # (the others wait for it, but no change to it replays to a saving: say both)
            text.append(f" (the others wait for it {ms(waited)} ms per step")
            phase = summary.straggler_phase_by_median
            mine = next((r for r in report.ranks if r.rank == rank), None)
            if phase is not None and mine is not None:
                text.append(f"; its {phase} takes {ms(mine.breakdown_ms[phase])} ms")
            text.append(
                ", but balancing it replays to a saving of under 5% of the step: the others "
                "then wait for what they do themselves)"
            )
        elif waited is not None:
            text.append(
                f" (waited for the most, but only {ms(waited)} ms per step: ranks are balanced)"
            )
        else:
            text.append(f" (busiest, but only {pct(excess)} above the median: ranks are balanced)")
    return text


def gpu_verdict_text(report: RunReport) -> Text | None:
    """The GPU verdict in words (None where the analysis gave none)."""
    verdict = report.gpu_verdict
    if verdict is None:
        return None
    text = Text()
    text.append(f"GPU idle {pct(verdict.idle_fraction)} of the step", style="bold")
    if len(report.ranks) > 1:
        text.append(f" on rank {verdict.rank}")
    # (where the cause is the same wait, its advice is said once, under the cause)
    cause = report.summary.cause
    framework = report.run.framework
    advised = cause is not None and cause_advice(cause, framework) is not None
    if verdict.wait == "data":
        text.append(f", waiting for the data loader ({pct(verdict.wait_fraction)} of the step)")
        if not (advised and cause is not None and (cause.kind == "io" or cause.phase == S.IO)):
            text.append(f": {gpu_advice('data', framework)}")
        return text
    phase = verdict.phase or S.OTHER
    text.append(f", waiting for the host ({pct(verdict.wait_fraction)} of the step): ")
    text.append(phase, style=PHASE_STYLE.get(phase, ""))
    if verdict.kernels_per_step is not None and verdict.kernel_us_p50 is not None:
        text.append(
            f" launches {verdict.kernels_per_step:g} kernels of "
            f"{duration_us(verdict.kernel_us_p50)} each"
        )
    else:
        text.append(" is host-bound")
    host_cause = advised and cause is not None and cause.kind in ("host_bound", "launch")
    advice = gpu_advice(phase, framework)
    if advice is not None and not host_cause:
        text.append(f" ({advice})")
    return text


def gpu_rank_text(rank: int, gpu: RankGpu) -> Text:
    """One GPU rank's device time in words: busy, idle by what the host did, launches, and each
    phase's kernel (device) time + its host-bound time (ms per step)."""
    idle = gpu.idle_ms
    text = Text()
    text.append(f"GPU rank {rank}: ", style="bold")
    text.append(
        f"busy {pct(gpu.busy_fraction)} ({ms(gpu.busy_ms)} ms); idle: host-bound "
        f"{ms(idle.host_bound)}, data {ms(idle.data)}, other {ms(idle.other)} ms; "
        f"sync {ms(gpu.sync_ms)} ms; {gpu.launches:g} kernels"
    )
    if gpu.launch_latency_us_p50 is not None and gpu.launch_latency_us_p95 is not None:
        text.append(
            f", launch latency {duration_us(gpu.launch_latency_us_p50)} "
            f"(p95 {duration_us(gpu.launch_latency_us_p95)})"
        )
        if gpu.launch_queue_us_p50 is not None and gpu.launch_queued_fraction is not None:
            text.append(
                f" after queueing {duration_us(gpu.launch_queue_us_p50)} behind earlier work "
                f"({pct(gpu.launch_queued_fraction)} of the launch delay)"
            )
    if gpu.short_kernel_fraction is not None:
        text.append(f", {pct(gpu.short_kernel_fraction)} shorter than their launch")
    text.append("\n  phases, kernels + host-bound:")
    parts = [p for p in gpu.phases if p.total_ms > 0]
    for i, p in enumerate(parts):
        text.append(" " if i == 0 else " · ")
        text.append(p.phase, style=PHASE_STYLE.get(p.phase, ""))
        text.append(f" {ms(p.device_ms)} + {ms(p.host_bound_ms)}")
    return text


#: The header of a breakdown's host-bound column, and what it means.
HOST_BOUND_HEADER = "host-bound"
HOST_BOUND_NOTE = (
    "host-bound: the part of a phase in which the device waited while the host, inside that "
    "phase, launched its work (included in the phase; the rest is its kernels' and copies' time)"
)


def host_bound_cell(host_bound: HostBound | None, phase: str) -> str:
    """A breakdown row's host-bound part (ms), blank for a phase that has none."""
    if host_bound is None or phase not in S.GPU_HOST_BOUND_PHASES:
        return ""
    return ms(host_bound[phase])


def host_bound_text(host_bound: HostBound) -> Text:
    """The host-bound parts of the phases in one line (ms per step)."""
    text = Text("of which host-bound:", style="bright_black")
    for i, phase in enumerate(S.GPU_HOST_BOUND_PHASES):
        text.append(" " if i == 0 else " · ")
        text.append(phase, style=PHASE_STYLE[phase])
        text.append(f" {ms(host_bound[phase])}")
    text.append(" ms")
    return text


#: The kernel-launch table's columns after the operator (text report and TUI).
KERNEL_COLUMNS = ("phase", "n", "dur µs", "p95", "launch", "p95", "queued", "short")
KERNEL_NOTE = (
    "n: kernels launched per step; dur: kernel duration; launch: launch latency in µs, the "
    "kernel's stream idle between the runtime call's start and the kernel's; queued: the share of "
    "the launch delay the stream was busy with earlier work (queueing, not a launch problem); "
    "short: "
    "kernels shorter than the call that launched them"
)


def kernel_rank(report: RunReport) -> tuple[int, RankGpu] | None:
    """The GPU rank whose kernel launches the views show: the verdict's, else the first."""
    gpus = [(r.rank, r.gpu) for r in sorted(report.ranks, key=lambda r: r.rank) if r.gpu]
    verdict = report.gpu_verdict
    return next(((r, g) for r, g in gpus if verdict and r == verdict.rank), None) or (
        gpus[0] if gpus else None
    )


def us_figure(value: float) -> str:
    """A µs figure: whole above 100, one decimal below."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def kernel_cells(k: KernelLaunches) -> list[Text]:
    """One (phase, operator) row of kernel launches, after the operator: KERNEL_COLUMNS."""
    phase = k.phase or S.OTHER
    return [
        Text(SHORT.get(phase, phase), style=PHASE_STYLE.get(phase, "")),
        *(
            Text(value, justify="right")
            for value in (
                f"{k.kernels_per_step:g}",
                us_figure(k.kernel_us_p50),
                us_figure(k.kernel_us_p95),
                us_figure(k.launch_latency_us_p50),
                us_figure(k.launch_latency_us_p95),
                pct(k.queued_fraction) if k.queued_fraction is not None else "-",
                pct(k.short_kernel_fraction),
            )
        ),
    ]


def fsdp_text(report: RunReport, top: int = 3) -> Text:
    """FSDP's all-gathers per phase in words (ms per step, mean of the ranks): how many units,
    how many prefetched, how much exposed, how long before their use they were done; then the
    units whose gathers are most exposed (``top`` of them at most, 3 at most)."""
    text = Text("FSDP all-gathers (ms per step, mean of the ranks)")
    phases: dict[str, list[FsdpGather]] = {}
    for g in report.fsdp_gathers:
        phases.setdefault(g.phase, []).append(g)
    for phase, units in phases.items():
        total = sum(g.total_ms for g in units)
        exposed = sum(g.exposed_ms for g in units)
        prefetched = sum(1 for g in units if g.prefetched >= 0.5)
        ahead = [g.ahead_ms for g in units if g.ahead_ms is not None]
        finished = f"; done {ms(min(ahead))}-{ms(max(ahead))} ms before use" if ahead else ""
        text.append(
            f"\n  in {phase}: {len(units)} unit(s) ({prefetched} prefetched), {ms(total)} ms, "
            f"{pct(exposed / total if total else 0.0)} exposed{finished}"
        )
        worst = sorted((g for g in units if g.exposed_ms > 0), key=lambda g: -g.exposed_ms)
        shown = [
            f"{safe(g.unit, 40)} {ms(g.exposed_ms)} ms "
            f"({'prefetched' if g.prefetched >= 0.5 else 'not prefetched'}"
            + (f", {ms(g.ahead_ms)} ms ahead)" if g.ahead_ms is not None else ")")
            for g in worst[: max(1, min(top, 3))]
        ]
        if shown:
            text.append("\n    most exposed: unit " + ", unit ".join(shown))
    return text
