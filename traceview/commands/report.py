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
    from traceview.analysis.heatmap import StepMatrix
    from traceview.model.choice import StepChoice
    from traceview.model.results import RunReport
    from traceview.store.outputs import OutputFile


TOP = 10  # operators a report lists unless asked for more or fewer


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


def load_page_inputs(
    paths: list[Path],
    rules: Path | None = None,
    top: int = 10,
    choice: StepChoice | None = None,
    window: int | None = None,
) -> tuple[RunReport, StepMatrix | None]:
    """The report and its ranks × steps matrix: what the HTML page draws."""
    from traceview.analysis.heatmap import step_matrix
    from traceview.runs import open_run
    from traceview.views.progress import TerminalProgress

    with TerminalProgress() as progress, open_run(paths, rules, progress, choice, window) as run:
        steps = run.steps
        return run.report(top), step_matrix(steps) if steps.num_rows else None


def write_page(
    report: RunReport,
    matrix: StepMatrix | None,
    target: OutputFile,
    shown: Path,
    stdout_taken: bool = False,
) -> None:
    """The HTML page into ``target`` (checked before the work), and where it went: on stderr
    where the page itself went to a stream, or stdout is taken (``--json``)."""
    import sys

    from traceview import __version__
    from traceview.model.escape import safe
    from traceview.views.html import write_html

    size = write_html(report, matrix, target.path, target.special, f"traceview {__version__}")
    print(f"{safe(str(shown))}: HTML report, {size / 1024:,.0f} KiB (open it in a browser)",
          file=sys.stderr if target.special or stdout_taken else sys.stdout)  # fmt: skip


class ReportCommand:
    name = "report"
    help = __doc__ or ""
    arrow_later = True  # (a run's kept report is shown without it: ``runs.finished``)

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
        parser.add_argument(
            "--json", action="store_true", help="print the report as one JSON object"
        )
        parser.add_argument(
            "--html",
            type=Path,
            metavar="FILE",
            help="write the report as one self-contained HTML page with figures instead of "
            "printing it (with --json, beside the JSON); it opens offline in any browser, to "
            "send or attach",
        )
        parser.add_argument(
            "--top", type=int, default=TOP, help=f"operators to list (default {TOP})"
        )
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
        from traceview.views.text import to_json

        choice = step_choice_of(args)
        if args.html is not None:
            from traceview.store import outputs

            target = outputs.export_file(args.html)  # (checked before the work)
            report, matrix = load_page_inputs(args.paths, args.rules, args.top, choice, args.window)
            write_page(report, matrix, target, args.html, stdout_taken=args.json)
            if args.json:
                print(to_json(report))
            return 0
        run = _plain_run(args, choice)
        key = None
        if run is not None:  # a run directory's plain report: the one kept there, if current
            from traceview.runs import finished

            if args.json:  # (printed as kept: 60 MB of 100,000 steps are not decoded)
                kept, key = finished.look_json(run, args.top, run)
                if kept is not None:
                    from traceview.model.escape import json_safe

                    print(json_safe(kept))
                    return 0
            else:
                found, key = finished.look(run, args.top, run)
                if found is not None:
                    self._show(found, args)
                    return 0
        report = load_report(args.paths, args.rules, args.top, choice, args.window)
        if run is not None:
            finished.write(run, args.top, report, key)
        self._show(report, args)
        return 0

    @staticmethod
    def _show(report: RunReport, args: argparse.Namespace) -> None:
        from traceview.views.text import render_to_console, to_json

        if args.json:
            print(to_json(report))
        else:
            render_to_console(report, top=args.top, all_ranks=args.all_ranks)


def _plain_run(args: argparse.Namespace, choice: StepChoice | None) -> Path | None:
    """The one run directory a report with no option that changes it was asked for (its kept
    report may answer: ``runs.finished``); None for anything else."""
    if len(args.paths) != 1 or args.rules is not None or choice is not None:
        return None
    if args.window is not None:
        return None
    (path,) = args.paths
    try:
        return path if (path / "manifest.json").is_file() else None
    except OSError:
        return None
