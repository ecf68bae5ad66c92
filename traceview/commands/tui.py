"""Explore a run in the terminal: where the time goes, per rank, step, thread and operator.

  traceview tui RUN                        a run directory, a folder of traces, or trace files
  traceview tui RUN_A RUN_B [RUN_C ...]    run directories or folders: the Compare screen
  traceview tui A0.json A1.json --compare B0.json --compare B1.json

Keys: 1-6 or tab switch screens (overview, timeline, operators, ranks, steps, compare),
? shows every key, q quits.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from traceview.commands.arguments import add_step_arguments, add_window_argument, step_choice_of


def run_groups(paths: list[Path], compare: list[Path] | None) -> list[list[Path]]:
    """The runs the user named: several folders are as many runs; files are one run; --compare
    adds one."""
    if compare:
        return [paths, compare]
    if len(paths) >= 2 and all(p.is_dir() for p in paths):
        return [[path] for path in paths]
    return [paths]


class TuiCommand:
    name = "tui"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
        parser.add_argument(
            "--compare",
            type=Path,
            action="append",
            metavar="PATH",
            help="a second run to compare with (repeat for each of its trace files)",
        )
        parser.add_argument(
            "--rules", type=Path, metavar="FILE", help="extra classification rules (TOML)"
        )
        add_step_arguments(parser)
        add_window_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from traceview.model.errors import UsageError

        choice = step_choice_of(args)
        groups = run_groups(args.paths, args.compare)
        for path in (p for group in groups for p in group):
            if not path.exists():
                raise UsageError(f"{path}: no such file or directory")

        # Textual is imported only now, so `traceview --help` stays fast.
        from traceview.tui.app import TraceviewApp

        # The app opens the runs in a worker (a loading line meanwhile) and keeps them open,
        # temporary run directories included, until it ends.
        app = TraceviewApp(groups=groups, rules=args.rules, choice=choice, window=args.window)
        try:
            app.run()
        finally:
            app.close_runs()
        if app.error is not None:
            raise app.error
        return app.return_code or 0
