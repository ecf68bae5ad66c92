"""A parameter-server job's processes in words: the workers' busy fractions and the servers'
work (``report.servers``), for the text report."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from traceview.model.results import Comparison, RunReport
from traceview.model.results.compare import kind_of
from traceview.views.style import pct, safe


def servers_text(report: RunReport) -> Text | None:
    """One line per role of a parameter-server job (None: not one)."""
    if report.run.architecture != "parameter_server":
        return None
    mode = {True: "synchronous", False: "asynchronous"}.get(report.run.synchronous)  # type: ignore[arg-type]
    text = Text(f"parameter server ({mode or 'synchrony not known'}): ", style="bold")
    text.append("workers: " if report.ranks else "no worker's steps")
    for i, rank in enumerate(report.ranks[:8]):
        said = [f"busy {pct(rank.busy_fraction)}" if rank.busy_fraction is not None else ""]
        said.append(f"{rank.steps_per_s:.1f} steps/s" if rank.steps_per_s is not None else "")
        if rank.staleness is not None:
            said.append(f"{rank.staleness:.2f} others' updates unseen a step")
        text.append(("; " if i else "") + f"rank {rank.rank} " + ", ".join(x for x in said if x))
    if len(report.ranks) > 8:
        text.append(f"; ... {len(report.ranks) - 8} more")
    for server in report.servers[:8]:
        text.append(f"\n  {server.role} rank {server.rank}")
        if server.host:
            text.append(f" on {safe(server.host, 40)}")
        if server.role == "chief" and server.dispatched is not None:
            ran = ", ".join(f"rank {r.rank} ran {r.steps_run}" for r in report.ranks[:8])
            text.append(f": handed out {server.dispatched} steps ({ran})")
        if server.role == "server":
            each = f" of {server.update_ms:.3f} ms" if server.update_ms is not None else ""
            text.append(f": {server.updates} updates{each}, {server.sums} sums of pushes")
            if server.busy_fraction is not None:
                text.append(f", busy {pct(server.busy_fraction)}")
                if server.bottleneck:
                    text.append(" (the workers' pushes queue behind it)", style="bold red")
    if len(report.servers) > 8:
        text.append(f"\n  ... and {len(report.servers) - 8} more (--json)")
    if report.run.architecture_from:
        text.append(f"\n  ({safe(report.run.architecture_from, 160)})", style="bright_black")
    return text


_SHORT = {
    "synchronous parameter server": "sync PS",
    "asynchronous parameter server": "async PS",
    "parameter server": "PS",
}


def workers_table(result: Comparison) -> Table | None:
    """Compared runs' workers side by side, where some run is a parameter-server job: the
    figures that tell all-reduce, synchronous and asynchronous parameter servers apart."""
    runs = result.runs
    if all(run.architecture == "collective" for run in runs):
        return None
    out = Table(title="Per worker", title_justify="left", box=None, pad_edge=False)
    for header in ("run", "kind", "rank", "step ms", "steps/s", "wait ms", "unseen/step"):
        out.add_column(header, justify="left" if header in ("run", "kind") else "right")
    for run in runs:
        for worker in run.workers:
            out.add_row(
                safe(run.label, 24),
                _SHORT.get(kind_of(run), kind_of(run)),
                str(worker.rank),
                f"{worker.step_ms:.2f}",
                f"{worker.steps_per_s:.1f}" if worker.steps_per_s is not None else "-",
                f"{worker.comm_wait_ms:.2f}" if worker.comm_wait_ms is not None else "-",
                f"{worker.staleness:.2f}" if worker.staleness is not None else "-",
            )
        if run.worker_steps_per_s is not None:
            out.add_row(
                safe(run.label, 24),
                _SHORT.get(kind_of(run), kind_of(run)),
                "all",
                "",
                f"{run.worker_steps_per_s:.1f}",
                "",
                "",
            )
    return out
