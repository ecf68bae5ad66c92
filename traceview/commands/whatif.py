"""What would make the step faster: the counted steps replayed across ranks with a change.

  traceview whatif PATH [--balance] [--balance-rank N] [--faster NAME:K] [--without NAME]
                        [--bandwidth OP:GBPS] [--hide-comm] [--no-late-start]
                        [--no-late-start-rank N] [--json]

The run's steps are re-timed from their critical-path graph (each rank's segments, the
collective and point-to-point edges, late starts): with no change it reproduces the measured
steps, and with each change asked for it predicts the step. NAME is a phase (forward,
backward, update, io, h2d, comm) or an operator or collective (fully_connected, allreduce); K a factor
(2: twice as fast); --without NAME takes it away altogether (NAME may also be host_bound, launch
or idle: that time on every rank). Without a change, the report's own what-ifs are printed (the
report's cause among them: ``summary.cause.change``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from traceview.commands.arguments import add_step_arguments, step_choice_of
from traceview.model.errors import UsageError

_FACTOR = re.compile(r"^(?P<name>[^:]+):(?P<k>[0-9]*\.?[0-9]+)$")


def _factor(text: str, flag: str) -> str:
    match = _FACTOR.match(text)
    if match is None or float(match["k"]) <= 0:
        raise UsageError(f"{flag} takes NAME:K with K a positive number, not {text!r}")
    return f"{match['name']}:{float(match['k']):g}"


def _named(text: str) -> str:
    name, _, rank = text.partition(":rank=")
    if not name or ":" in name or (rank and not rank.isdigit()) or (":" in text and not rank):
        raise UsageError(
            f"--without takes a phase, operator or collective name (or idle:rank=N), not {text!r}"
        )
    return text


class WhatIfCommand:
    name = "whatif"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
        parser.add_argument(
            "--balance", action="store_true", help="every rank's phases at the median rank's"
        )
        parser.add_argument(
            "--balance-rank", type=int, action="append", metavar="N",
            help="rank N's phases at the median of the others' (repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--balance-stage", type=int, action="append", metavar="K",
            help="pipeline stage K's work at the median of the other stages' (repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--faster", action="append", metavar="NAME:K",
            help="a phase, operator or collective K times faster (repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--without", action="append", metavar="NAME",
            help="a phase, operator or collective (or host_bound, launch, idle) taking no time "
            "(repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--bandwidth", action="append", metavar="OP:GBPS",
            help="collective OP's transfers at a bus bandwidth of GBPS Gb/s (repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--hide-comm", action="store_true", help="every wait for communication gone"
        )
        parser.add_argument(
            "--no-late-start", action="store_true", help="every rank starts each step at once"
        )
        parser.add_argument(
            "--no-late-start-rank", type=int, action="append", metavar="N",
            help="rank N starts each step with the first rank (repeatable)",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="print the what-ifs as JSON")
        parser.add_argument(
            "--rules", type=Path, metavar="FILE", help="extra classification rules (TOML)"
        )
        add_step_arguments(parser)

    def changes(self, args: argparse.Namespace) -> list[str]:
        asked = ["balance"] if args.balance else []
        asked += [f"balance:rank={n}" for n in args.balance_rank or []]
        asked += [f"balance:stage={k}" for k in args.balance_stage or []]
        asked += [f"faster:{_factor(t, '--faster')}" for t in args.faster or []]
        asked += [f"without:{_named(t)}" for t in args.without or []]
        asked += [f"bandwidth:{_factor(t, '--bandwidth')}" for t in args.bandwidth or []]
        asked += ["hide_comm"] * args.hide_comm + ["no_late_start"] * args.no_late_start
        asked += [f"no_late_start:rank={n}" for n in args.no_late_start_rank or []]
        return asked

    def run(self, args: argparse.Namespace) -> int:
        from rich.text import Text

        from traceview.model.escape import safe
        from traceview.model.results import WhatIfs
        from traceview.runs import open_run
        from traceview.views.progress import TerminalProgress
        from traceview.views.style import change_words, ms
        from traceview.views.text import _console, to_json

        asked = self.changes(args)
        with (
            TerminalProgress() as progress,
            open_run(args.paths, args.rules, progress, step_choice_of(args)) as run,
        ):
            ranks = set(run.manifest.ranks_present or [r.rank for r in run.manifest.ranks])
            named = {
                *(args.balance_rank or []),
                *(args.no_late_start_rank or []),
                *(int(t.partition(":rank=")[2]) for t in args.without or [] if ":rank=" in t),
            }
            unknown = sorted(named - ranks)
            if unknown:
                raise UsageError(
                    f"rank {unknown[0]}: the run has no such rank "
                    f"(ranks {min(ranks, default=0)}-{max(ranks, default=0)})"
                )
            report = run.report(whatif=["none", *asked])
        if report.critical_path is None:
            raise UsageError("no critical path in this run: it has no step windows to replay")
        done = {w.change for w in report.whatif}
        shown = (
            [w for w in report.whatif if w.change in {"none", *asked}] if asked else report.whatif
        )
        result = WhatIfs(
            steps=report.critical_path.steps,
            whatif=shown,
            not_applicable=[a for a in asked if a not in done],
        )
        if args.json:
            print(to_json(result))
            return 0
        console = _console()
        console.print(
            f"replayed {result.steps} step{'s' * (result.steps != 1)} across "
            f"{report.run.ranks} rank{'s' * (report.run.ranks != 1)}"
        )
        for w in result.whatif:
            words = (
                "as measured (none)"
                if w.change == "none"
                else f"{change_words(w.change)} ({safe(w.change)})"
            )
            console.print(Text(f"  {ms(w.step_ms):>9} ms  {w.speedup:5.2f}x  {words}"))
        for change in result.not_applicable:
            console.print(
                Text(f"note: {change}: nothing in this run it applies to", style="bright_black")
            )
        return 0
