"""Runs side by side: step time, phases, hidden communication and canonical operators, with ratios.

  traceview compare RUN_A RUN_B [RUN_C ...]
  traceview compare RUN --window 1 --window 3     two profile windows of one run

Each RUN is a run directory or a folder of traces (several files of one run: use a folder).
The first is the baseline: every ratio is against it. Operators are compared by canonical name
(convolution, convolution_backward, batch_norm, fully_connected, allreduce ...), so runs of
different frameworks, settings or rank counts line up.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from traceview.commands.arguments import (
    add_runs_argument,
    add_step_arguments,
    add_window_argument,
    step_choice_of,
)
from traceview.model.errors import UsageError


class CompareCommand:
    name = "compare"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        add_runs_argument(parser)
        parser.add_argument(
            "--json", action="store_true", help="print the comparison as one JSON object"
        )
        parser.add_argument(
            "--top", type=int, default=15, help="operators to compare (default 15, as the TUI)"
        )
        parser.add_argument(
            "--rules", type=Path, metavar="FILE", help="extra classification rules (TOML)"
        )
        add_step_arguments(parser)
        add_window_argument(parser, several=True)

    def run(self, args: argparse.Namespace) -> int:
        from traceview.analysis.compare import compare
        from traceview.runs import open_runs
        from traceview.views.progress import TerminalProgress
        from traceview.views.text import render_comparison_to_console, to_json

        runs, windows = list(args.runs), args.window or []
        if len(runs) == 1 and len(windows) >= 2:  # (windows of one run)
            runs = runs * len(windows)
        if len(runs) < 2:
            raise UsageError("compare needs at least two runs (or one run and two --window)")
        if windows and len(windows) not in (1, len(runs)):
            raise UsageError(f"{len(windows)} --window for {len(runs)} runs: give one per run")
        chosen = windows * len(runs) if len(windows) == 1 else windows or None
        choice = step_choice_of(args)
        with (
            TerminalProgress() as progress,
            open_runs(
                [[path] for path in runs], args.rules, progress, args.label, choice, chosen
            ) as runs,
        ):
            result = compare(
                [r.report() for r in runs], [r.ops for r in runs], [r.label for r in runs], args.top
            )
        if args.json:
            print(to_json(result))
        else:
            render_comparison_to_console(result)
        return 0
