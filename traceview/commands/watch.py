"""Watch a run while it trains: each rank's step and lag, the step time over the whole run, the
slowest rank and for how long, throughput, and alerts.

  traceview watch RUN                  a live screen (p: profile the next steps; q: quit)
  traceview watch RUN --once --json    one look, as one JSON object

RUN is the run directory `traceview collect -o RUN -- ...` is writing (from another terminal or
another host that sees it), or one it wrote. Nothing is written into it (p writes one request,
as `traceview profile` does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class WatchCommand:
    name = "watch"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run", type=Path, metavar="RUN")
        parser.add_argument("--once", action="store_true", help="one look, then exit")
        parser.add_argument(
            "--json", action="store_true", help="with --once: the look as one JSON object"
        )
        parser.add_argument(
            "--interval",
            type=float,
            default=0.5,
            metavar="SECONDS",
            help="how often the live screen looks again (default 0.5)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.model.errors import UsageError
        from traceview.runs.live import LiveRun, check_run

        if args.json and not args.once:
            raise UsageError("--json prints one look: give --once with it")
        if not 0.05 <= args.interval <= 3600:
            raise UsageError("--interval must be between 0.05 and 3600 seconds")
        if not args.once and not (sys.stdout.isatty() and sys.stdin.isatty()):
            raise UsageError(
                "the live screen needs a terminal: run watch in one, or give --once (and "
                "--json) for one look"
            )
        check_run(args.run)
        if args.once:
            look = LiveRun(args.run).snapshot()
            if args.json:
                print(look.to_json().decode())
            else:
                from traceview.views.live import render_snapshot_to_console

                render_snapshot_to_console(look, args.run)
            return 0
        from traceview.tui.live import LiveApp

        app = LiveApp(args.run, interval=args.interval)
        app.run()
        if app.error is not None:
            raise app.error
        return 0
