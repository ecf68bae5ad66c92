"""Profile a running job now: every rank profiles its next N steps, at a step boundary.

  traceview profile RUN [--steps 5] [--warmup W] [--wait]

RUN is the run directory `traceview collect -o RUN -- ...` is writing. Each rank (PyTorch) reads
the request within a second, warms up for W steps (default: collect's --warmup) and records N,
the same steps on every rank, with the memory cap of the first window; the window lands in
RUN/windows/K as it completes. `traceview report RUN` reads the newest window, `--window K` any;
`traceview compare RUN --window 0 --window K` compares two. A job that has ended, or a folder
collect did not make, is refused (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


class ProfileCommand:
    name = "profile"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run", type=Path, metavar="RUN")
        parser.add_argument(
            "--steps", type=int, default=5, help="steps to record per rank (default 5)"
        )
        parser.add_argument(
            "--warmup",
            type=int,
            default=None,
            help="steps profiled but not recorded first (default: collect's --warmup)",
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help="wait until every rank has written the window (or the job ends)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=600.0,
            metavar="SECONDS",
            help="with --wait: give up after SECONDS (default 600)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.collectors.rankside_record import MAX_WINDOW_STEPS, MAX_WINDOW_WARMUP
        from traceview.model.errors import BadInput, UsageError
        from traceview.runs.live import ask_profile
        from traceview.runs.windows import list_windows

        if not 1 <= args.steps <= MAX_WINDOW_STEPS:
            raise UsageError(f"--steps must be between 1 and {MAX_WINDOW_STEPS}")
        if args.warmup is not None and not 0 <= args.warmup <= MAX_WINDOW_WARMUP:
            raise UsageError(f"--warmup must be between 0 and {MAX_WINDOW_WARMUP}")
        window, start, ranks = ask_profile(args.run, args.steps, args.warmup)
        last = start + args.steps - 1
        print(
            f"traceview: asked {ranks} rank(s) to profile steps {start}-{last} (window "
            f"{window}); it lands in {args.run}/windows/{window} "
            f"(traceview report {args.run} --window {window})",
            file=sys.stderr,
        )
        if not args.wait:
            return 0
        from traceview.runs.live import LiveRun

        live = LiveRun(args.run)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            look = live.look()
            found = [
                w for w in list_windows(args.run, look.job.ended, len(look.ranks) or None)
                if w.window == window
            ]  # fmt: skip
            state = found[0].state if found else "asked"
            if state == "complete":
                print(f"traceview: window {window} written by every rank", file=sys.stderr)
                return 0
            if look.job.ended:
                raise BadInput(
                    f"{args.run}: the job ended before every rank wrote window {window} "
                    f"({found[0].ranks if found else 0} did)"
                )
            time.sleep(0.25)
        raise BadInput(f"{args.run}: window {window} not written after {args.timeout:g} s")
