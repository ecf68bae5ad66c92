"""Render the run summary (analysis.summary) as text for a terminal or as JSON."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from traceview import schema as S
from traceview.text import safe

PHASE_STYLE = {
    S.IO: "magenta",
    S.H2D: "cyan",
    S.FORWARD: "green",
    S.BACKWARD: "blue",
    S.UPDATE: "yellow",
    S.COMM: "red",
    S.OTHER: "white",
    S.IDLE: "bright_black",
}
#: One letter per phase, so the breakdown reads without colour too.
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


def _table(title: str) -> Table:
    """A report table: its title on the left, no box, columns one space apart."""
    return Table(title=title, title_justify="left", box=None, pad_edge=False, padding=(0, 1))


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=None, separators=(",", ":"), default=str)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _ms(value: float) -> str:
    return f"{value:,.2f}" if value < 100 else f"{value:,.1f}"


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def phase_bar(breakdown: dict[str, float], width: int) -> Text:
    """A stacked bar of the breakdown: coloured, and lettered so it reads in monochrome."""
    total = sum(breakdown.get(p, 0.0) for p in S.BREAKDOWN_PHASES)
    bar = Text()
    if total <= 0 or width <= 0:
        return bar
    cells, acc = 0, 0.0
    for phase in S.BREAKDOWN_PHASES:
        acc += breakdown.get(phase, 0.0)
        end = round(acc / total * width)
        if end > cells:
            bar.append(PHASE_LETTER[phase] * (end - cells), style=f"reverse {PHASE_STYLE[phase]}")
            cells = end
    return bar


def _verdict(report: dict[str, Any]) -> Text:
    summary = report["summary"]
    step = summary["step_ms"]
    bottleneck = summary["bottleneck"]
    text = Text()
    if bottleneck is None:
        return Text("no phase time found")
    share = summary["bottleneck_share"]
    text.append(f"{bottleneck}", style=f"bold {PHASE_STYLE[bottleneck]}")
    text.append(f" is the bottleneck: {_pct(share)} of the {_ms(step)} ms step")
    if summary["comm_total_ms"] > 0:
        hidden = summary["comm_hidden_fraction"]
        text.append(
            f"; communication {_ms(summary['comm_total_ms'])} ms per step, {_pct(hidden)} of it "
            f"hidden behind compute (hidden: {summary['hidden']})"
        )
    return text


def render(report: dict[str, Any], console: Console, *, top: int = 10) -> None:
    run, summary, ranks = report["run"], report["summary"], report["ranks"]
    title = Text()
    title.append("traceview", style="bold")
    world = run.get("world_size")
    of_world = f" of {world}" if world and world != run["ranks"] else ""
    title.append(
        f" · {safe(run['framework'] or '?')} · {_count(run['ranks'], 'rank')}{of_world}"
        f" · {_count(run['steps'], 'step')} · {run['timeline'] or '?'} timeline"
    )
    console.print(title)
    job = run.get("job")
    if job:
        line = Text(
            f"job: {safe(' '.join(map(str, job.get('command') or [])), 120)} · exit code {job.get('exit_code')}"
        )
        if job.get("clock_uncertainty_us") is not None:
            line.append(
                f" · clocks aligned to ±{job['clock_uncertainty_us']:g} µs"
                f" (largest offset {job['max_clock_offset_us']:g} µs)"
            )
        console.print(line, style="bright_black")
    console.print(_verdict(report))
    console.print()

    breakdown = _table("Per step (exclusive, mean of ranks)")
    breakdown.add_column("phase")
    breakdown.add_column("ms", justify="right")
    breakdown.add_column("share", justify="right")
    breakdown.add_column("")
    step = summary["step_ms"] or 1.0
    for phase in S.BREAKDOWN_PHASES:
        value = summary["breakdown_ms"][phase]
        width = round(value / step * 30)
        bar = Text(PHASE_LETTER[phase] * width, style=f"reverse {PHASE_STYLE[phase]}")
        breakdown.add_row(
            Text(phase, style=PHASE_STYLE[phase]), _ms(value), _pct(value / step), bar
        )
    breakdown.add_row(
        Text("step", style="bold"), Text(_ms(summary["step_ms"]), style="bold"), "100%", ""
    )
    console.print(breakdown)
    console.print()

    comm = Text("communication: ")
    if summary["comm_total_ms"] > 0:
        comm.append(
            f"total {_ms(summary['comm_total_ms'])} ms, exposed {_ms(summary['comm_exposed_ms'])} ms, "
            f"hidden {_pct(summary['comm_hidden_fraction'])}  →  hidden: "
        )
        comm.append(summary["hidden"], style="bold")
    else:
        comm.append("none found")
    console.print(comm)
    if summary.get("straggler_rank") is not None:
        excess = summary.get("straggler_excess", 0.0)
        line = Text(f"straggler: rank {summary['straggler_rank']}")
        if summary.get("straggler_significant"):
            line.append(
                f" (busy {_pct(excess)} longer than the median rank; the others wait for it)"
            )
        else:
            line.append(f" (busiest, but only {_pct(excess)} above the median: ranks are balanced)")
        console.print(line)
    console.print()

    if ranks:
        table = _table("Per rank (ms per step)")
        table.add_column("rank", justify="right")
        table.add_column("step", justify="right")
        for phase in S.BREAKDOWN_PHASES:
            table.add_column(SHORT[phase], justify="right", style=PHASE_STYLE[phase])
        table.add_column("hidden", justify="right")
        bar_width = console.width - 76
        if bar_width >= 10:
            table.add_column("", no_wrap=True)
        significant = bool(summary.get("straggler_significant"))
        for row in sorted(ranks, key=lambda r: r["rank"]):
            straggler = significant and row["rank"] == summary.get("straggler_rank")
            cells: list[Text | str] = [
                Text(f"{row['rank']}{'*' if straggler else ''}", style="bold" if straggler else ""),
                _ms(row["step_ms"]),
                *(_ms(row["breakdown_ms"][p]) for p in S.BREAKDOWN_PHASES),
                _pct(row["comm_hidden_fraction"]) if row["comm_total_ms"] > 0 else "-",
            ]
            if bar_width >= 10:
                cells.append(phase_bar(row["breakdown_ms"], min(bar_width, 40)))
            table.add_row(*cells)
        console.print(table)
        if significant:
            console.print(Text("* the straggler", style="bright_black"))
        console.print()

    if report.get("top_ops"):
        ops = _table("Top operators (per step)")
        ops.add_column("op", no_wrap=True, overflow="ellipsis", max_width=24)
        ops.add_column("phase", no_wrap=True)
        ops.add_column("on", no_wrap=True)
        ops.add_column("calls", justify="right", no_wrap=True)
        ops.add_column("self ms", justify="right", no_wrap=True)
        ops.add_column("total ms", justify="right", no_wrap=True)
        name_width = max(console.width - 66, 12)
        ops.add_column("name in the trace", no_wrap=True, overflow="ellipsis", max_width=name_width)
        for op in report["top_ops"][:top]:
            ops.add_row(
                Text(safe(op["op"], 60)),
                Text(SHORT.get(op["phase"], op["phase"]), style=PHASE_STYLE.get(op["phase"], "")),
                op["device"],
                f"{op['calls_per_step']:g}",
                _ms(op["self_ms_per_step"]),
                _ms(op["total_ms_per_step"]),
                Text(safe(op["name"], 200)),
            )
        console.print(ops)
        console.print()

    for warning in report.get("warnings", []):
        console.print(Text("warning: " + safe(warning), style="yellow"))
    for remark in report.get("remarks", []):
        console.print(Text("note: " + safe(remark), style="bright_black"))


def render_to_console(report: dict[str, Any], *, top: int = 10) -> None:
    render(report, Console(highlight=False, markup=False, emoji=False), top=top)


def _ratio_text(ratio: float | None) -> Text:
    """×1.00 plain; slower (above 1) red, faster green, so the eye finds the differences."""
    if ratio is None:
        return Text("-", style="bright_black")
    style = "red" if ratio >= 1.1 else "green" if ratio <= 1 / 1.1 else ""
    return Text(f"×{ratio:.2f}", style=style)


def render_comparison(result: dict[str, Any], console: Console) -> None:
    runs = result["runs"]
    labels = [safe(r["label"], 24) for r in runs]
    console.print(
        Text("traceview compare", style="bold")
        + Text(f" · {len(runs)} runs · baseline {labels[0]}")
    )
    for run, label in zip(runs, labels, strict=True):
        line = Text(f"  {label}: ", style="bold")
        line.append(
            f"{safe(run['framework'] or '?')}, {_count(run['ranks'], 'rank')}, "
            f"{_count(run['steps'], 'step')}, {run['timeline'] or '?'} timeline"
        )
        console.print(line)
    console.print()
    for highlight in result["highlights"]:
        console.print(Text("• " + safe(highlight, 200)))
    if result["highlights"]:
        console.print()

    def table(title: str, first: str) -> Table:
        t = _table(title)
        t.add_column(first, no_wrap=True, overflow="ellipsis", max_width=26)
        for i, label in enumerate(labels):
            t.add_column(label, justify="right", no_wrap=True, overflow="ellipsis", max_width=22)
            if i:
                t.add_column("", justify="right", no_wrap=True)
        return t

    def cells(values: list[float], ratios: list[float | None]) -> list[Text | str]:
        # an operator a run does not have reads "-", not 0.00 ms ×0.00
        out: list[Text | str] = [_ms(values[0]) if values[0] else "-"]
        for value, ratio in zip(values[1:], ratios[1:], strict=True):
            out += [_ms(value), _ratio_text(ratio)] if value else ["-", ""]
        return out

    phases = table("Per step (ms, exclusive)", "phase")
    for row in result["phases"]:
        phases.add_row(
            Text(row["phase"], style=PHASE_STYLE[row["phase"]]), *cells(row["ms"], row["ratio"])
        )
    phases.add_row(
        Text("step", style="bold"),
        *cells([r["step_ms"] for r in runs], [r["step_ratio"] for r in runs]),
    )
    hidden: list[Text | str] = []
    for i, run in enumerate(runs):
        hidden.append(_pct(run["comm_hidden_fraction"]) if run["comm_total_ms"] > 0 else "-")
        if i:
            hidden.append("")
    phases.add_row(Text("comm hidden"), *hidden)
    console.print(phases)
    console.print()

    if result["ops"]:
        ops = table("Canonical operators (ms per step)", "op")
        for row in result["ops"]:
            ops.add_row(Text(safe(row["op"], 60)), *cells(row["ms"], row["ratio"]))
        console.print(ops)
        console.print(
            Text(
                "operators: device time of their kernels on GPU runs, inclusive host time on CPU runs",
                style="bright_black",
            )
        )


def render_comparison_to_console(result: dict[str, Any]) -> None:
    render_comparison(result, Console(highlight=False, markup=False, emoji=False))


def _predictions(result: dict[str, Any], key: str, title: str) -> Table:
    """Each run's measured step beside each model's prediction (``key``) and its error."""
    table = _table(title)
    table.add_column("ranks", justify="right")
    table.add_column("measured", justify="right")
    for name in result["models"]:
        table.add_column(name, justify="right", no_wrap=True)
    for run in result["runs"]:
        row: list[Text | str] = [str(run["ranks"]), _ms(run["step_ms"])]
        for name in result["models"]:
            p = run[key][name]
            err = f" ({_pct(p['error'])})" if p["error"] is not None else ""
            bold = key == "predicted" and name == result["best_model"]
            row.append(Text(f"{_ms(p['step_ms'])}{err}", style="bold" if bold else ""))
        table.add_row(*row)
    return table


def render_scaling(result: dict[str, Any], console: Console) -> None:
    base = result["base"]
    console.print(
        Text("traceview scaling", style="bold")
        + Text(f" · {len(result['runs'])} runs · weak scaling")
    )
    console.print(
        Text(
            f"baseline {safe(base['label'], 40)}: {_count(base['ranks'], 'rank')}, "
            f"{_ms(base['step_ms'])} ms per step"
        )
    )
    best = result["best_model"]
    if best:
        errors = ", ".join(
            f"{m} {_pct(v['mean_error'])}"
            for m, v in result["models"].items()
            if v["mean_error"] is not None
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
        "samples/s",
        "comm ms",
        "hidden",
        "compute",
    ):
        measured.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for run in result["runs"]:
        measured.add_row(
            Text(safe(run["label"], 24)),
            str(run["ranks"]),
            _ms(run["step_ms"]),
            f"{run['speedup']:.2f}" if run["speedup"] is not None else "-",
            _pct(run["efficiency"]) if run["efficiency"] is not None else "-",
            f"{run['samples_per_s']:,.0f}" if run["samples_per_s"] is not None else "-",
            _ms(run["comm_total_ms"]),
            _pct(run["comm_hidden_fraction"]) if run["comm_total_ms"] > 0 else "-",
            f"×{run['compute_ratio']:.2f}" if run.get("compute_ratio") is not None else "-",
        )
    console.print(measured)
    console.print(
        Text(
            "compute: each run's compute time per step against the smallest run's",
            style="bright_black",
        )
    )
    console.print()

    console.print(
        _predictions(result, "predicted", "Predicted step ms (error against the measurement)")
    )
    if any((r.get("compute_ratio") or 1.0) > 1.2 for r in result["runs"]):
        console.print()
        console.print(
            _predictions(
                result,
                "predicted_own_compute",
                "Same models, each run's own compute (comm model alone)",
            )
        )
    console.print()

    what_if = _table("What if (step ms / speedup)")
    what_if.add_column("ranks", justify="right")
    keys = [k for k in result["runs"][0]["what_if"] if k.endswith("_ms")]
    headers = {"comm_hidden_ms": "comm hidden", "io_hidden_ms": "io hidden"}
    for key in keys:
        what_if.add_column(
            headers.get(key, key.removesuffix("_ms").replace("_", " ")), justify="right"
        )
    for run in result["runs"]:
        w = run["what_if"]
        what_if.add_row(
            str(run["ranks"]),
            *(f"{_ms(w[k])} / {w[k.replace('_ms', '_speedup')] or 0:.2f}" for k in keys),
        )
    console.print(what_if)

    if result.get("link_gbps"):
        console.print()
        ar = _table(f"All-reduce against a {result['link_gbps']:g} Gb/s link")
        for name in ("ranks", "MB per step", "algbw Gb/s", "busbw Gb/s", "efficiency"):
            ar.add_column(name, justify="right")
        for run in result["runs"]:
            a = run.get("allreduce")
            if a:
                ar.add_row(
                    str(run["ranks"]), f"{a['bytes_per_step'] / 1e6:,.1f}", f"{a['algbw_gbps']:.2f}",
                    f"{a['busbw_gbps']:.2f}", _pct(a["efficiency"]),
                )  # fmt: skip
            else:
                ar.add_row(str(run["ranks"]), "-", "-", "-", "-")
        console.print(ar)
    for note in result.get("notes", []):
        console.print(Text("note: " + safe(note), style="bright_black"))


def render_scaling_to_console(result: dict[str, Any]) -> None:
    render_scaling(result, Console(highlight=False, markup=False, emoji=False))
