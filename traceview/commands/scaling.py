"""How a job scales from its smallest run to N workers, measured and as the model predicts it.

  traceview scaling RUN_1 RUN_2 RUN_4 ... [--batch-size B] [--link-gbps G]

Each RUN is a run directory or a folder of traces of the same job with a different number of
ranks (weak scaling: each rank its own mini-batch of B samples). Prints throughput, speedup and
efficiency per run, the step time the performance model predicts (sequential, pipelined I/O,
layer-wise overlap) and how far off each model is, and what-ifs: communication hidden, data
loading hidden, communication k times faster. With --link-gbps, all-reduce efficiency too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from traceview.commands.arguments import add_runs_argument, add_step_arguments, step_choice_of
from traceview.model.errors import UsageError


class ScalingCommand:
    name = "scaling"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        add_runs_argument(parser)
        parser.add_argument("--batch-size", type=int, help="per-worker mini-batch, for samples/s")
        parser.add_argument(
            "--link-gbps", type=float, help="link bandwidth, for all-reduce efficiency"
        )
        parser.add_argument(
            "--faster-comm", type=float, default=2.0, metavar="K", help="what-if factor (default 2)"
        )
        parser.add_argument(
            "--json", action="store_true", help="print the analysis as one JSON object"
        )
        parser.add_argument(
            "--allow-partial",
            action="store_true",
            help="take a run that holds fewer ranks than its job had (some ranks' traces "
            "missing) as a run of the ranks it holds, with a note; refused otherwise",
        )
        parser.add_argument(
            "--rules", type=Path, metavar="FILE", help="extra classification rules (TOML)"
        )
        add_step_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from traceview.analysis.scaling import partial_run, scaling, traced_batch_size
        from traceview.model.escape import safe
        from traceview.runs import open_runs
        from traceview.views.progress import TerminalProgress
        from traceview.views.text import render_scaling_to_console, to_json

        if len(args.runs) < 2:
            raise UsageError("scaling needs at least two runs with different numbers of ranks")
        if args.batch_size is not None and args.batch_size < 1:
            raise UsageError("--batch-size must be at least 1")
        choice = step_choice_of(args)
        with (
            TerminalProgress() as progress,
            open_runs(
                [[path] for path in args.runs], args.rules, progress, args.label, choice
            ) as runs,
        ):
            reports = [r.report() for r in runs]
            for run, report in zip(runs, reports, strict=True):
                partial = partial_run(report)
                if partial and not args.allow_partial:
                    raise UsageError(
                        f"{safe(run.label)}: {partial}: part of a larger job, not a smaller "
                        "one (give every rank's trace, or --allow-partial)"
                    )
            counts = [r.run.ranks for r in reports]
            if len(set(counts)) < len(counts):
                raise UsageError(f"two runs have the same number of ranks ({sorted(counts)})")
            schedules = [r.comm_schedules(report) for r, report in zip(runs, reports, strict=True)]
            result = scaling(
                reports, [r.ops for r in runs], [r.label for r in runs],
                batch_size=args.batch_size,
                traced_batch_sizes=[traced_batch_size(r.manifest) for r in runs],
                schedules=schedules, link_gbps=args.link_gbps, faster_comm=args.faster_comm,
            )  # fmt: skip
        if args.json:
            print(to_json(result))
        else:
            render_scaling_to_console(result)
        return 0
