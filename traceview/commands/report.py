"""Where each step's time goes: the per-step breakdown per rank and for the run.

PATH is a run directory, a folder of traces, or trace files (read into a temporary run). PyTorch
Flight Recorder dumps in the folder (pickle or JSON, with or without traces) say how a failed
job ended.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from traceview.commands.arguments import add_step_arguments, add_window_argument, step_choice_of

if TYPE_CHECKING:
    from traceview.model.choice import StepChoice
    from traceview.model.results import RunReport


def load_report(
    paths: list[Path],
    rules: Path | None = None,
    top: int = 10,
    choice: StepChoice | None = None,
    window: int | None = None,
) -> RunReport:
    """The report object for a run directory, or for traces read into a temporary run
    (``window``: of a run collect made, its profile window; None: the newest)."""
    from traceview.runs import open_run
    from traceview.views.progress import TerminalProgress

    with TerminalProgress() as progress, open_run(paths, rules, progress, choice, window) as run:
        return run.report(top)


class ReportCommand:
    name = "report"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
        parser.add_argument(
            "--json", action="store_true", help="print the report as one JSON object"
        )
        parser.add_argument("--top", type=int, default=10, help="operators to list (default 10)")
        parser.add_argument(
            "--rules", type=Path, metavar="FILE", help="extra classification rules (TOML)"
        )
        parser.add_argument(
            "--all-ranks",
            action="store_true",
            help="a row for every rank (above 16 ranks the text report shows their "
            "distribution: p50, p90, max, the ranks with most and least own work)",
        )
        add_step_arguments(parser)
        add_window_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from traceview.views.text import render_to_console, to_json

        report = load_report(args.paths, args.rules, args.top, step_choice_of(args), args.window)
        if args.json:
            print(to_json(report))
        else:
            render_to_console(report, top=args.top, all_ranks=args.all_ranks)
        return 0
