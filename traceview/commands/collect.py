"""Profile every rank of a training job, unmodified, then report where its steps' time goes.

  traceview collect [-o RUN] [--steps 5 --warmup 2 --skip 1] -- COMMAND [ARGS...]

COMMAND is what you already run: `mpirun -np 4 python train.py`, `srun ...`, `torchrun ...`,
`traceview-dmlc -n 2 -s 1 python train.py` (an MXNet parameter-server job), `python train.py`.
In every process of the job, once it imports PyTorch, TensorFlow, JAX, MXNet or Chainer, the
framework's profiler (Chainer's: traceview's own function hooks) lets --skip steps pass, warms up
for --warmup steps and records --steps (a step: an optimizer step, a tf.data batch or Keras batch,
a call of a JAX job's step function (the first jit- or pmap-compiled function called twice), a
gluon Trainer step, a Chainer optimizer update, or the script's own
traceview.collectors.step()); each rank's trace and status land in RUN/raw/, and the run is
then read and reported. A process that drives several devices (JAX, TensorFlow's mirrored
strategies) is one rank per device. The exit code is the job's. A rank whose profile grows its memory by more
than --max-profile-memory (default 2G) stops profiling, writes what it has and runs on.

Every rank (PyTorch, TensorFlow, MXNet, Chainer) also keeps a step record of the whole run,
profiled or not: each step's start and end, its data loading, each collective it calls from
Python, and, when it stalls for --stall seconds, is ended by the launcher or raises, every
thread's Python stack (and PyTorch's Flight Recorder). A job that hangs,
desynchronizes or dies is reported as such: which rank, which step, which call.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from pathlib import Path
from typing import Any

from traceview.model.errors import UsageError
from traceview.model.escape import safe
from traceview.model.manifest import Manifest, collected

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_size(text: str) -> int:
    """``4G``, ``512M``, ``1.5GiB``, ``1000000`` (bytes); ``0``, ``none`` or ``off``: no cap."""
    if text.strip().lower() in ("none", "off"):
        return 0
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes or a number with K, M, G or T (binary: 4G is "
            "4 GiB), or 0/none for no cap"
        )
    return int(float(match[1]) * _UNITS[match[2].upper()])


def _full(run: Path) -> str | None:
    """Says the run directory's file system is full where it has (next to) no room left."""
    import os

    try:
        room = os.statvfs(run)
    except OSError:
        return None
    if room.f_bavail * room.f_frsize < (64 << 10) or (room.f_files and room.f_favail == 0):
        return "the run directory's file system is full"
    return None


class CollectCommand:
    name = "collect"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            metavar="RUN",
            help="run directory (default: ./traceview-run-DATE-TIME)",
        )
        parser.add_argument(
            "--steps", type=int, default=5, help="steps to record per rank (default 5)"
        )
        parser.add_argument(
            "--warmup",
            type=int,
            default=2,
            help="steps profiled but not recorded first (default 2)",
        )
        parser.add_argument(
            "--skip", type=int, default=1, help="steps left alone before the warm-up (default 1)"
        )
        parser.add_argument(
            "--nvtx", choices=("auto", "on", "off"), default="auto",
            help="mark the phases as NVTX ranges for Nsight Systems (auto: when it is attached)",
        )  # fmt: skip
        parser.add_argument(
            "--memory",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="record the allocator's memory (PyTorch profile_memory=True) for the report's "
            "memory section; --no-memory leaves it out (default: on)",
        )
        parser.add_argument(
            "--max-profile-memory",
            type=memory_size,
            default=None,
            metavar="SIZE",
            help="a rank whose memory grows by more than SIZE while it profiles stops profiling, "
            "keeps the steps it recorded and runs on (default 2G; 0 or none: no cap)",
        )
        parser.add_argument(
            "--stall",
            type=float,
            default=None,
            metavar="SECONDS",
            help="a rank that ends no step and makes no collective call for SECONDS writes "
            "every thread's Python stack to its step record (default 20)",
        )
        parser.add_argument(
            "--no-report", action="store_true", help="ingest, but do not print the report"
        )
        parser.add_argument(
            "--live",
            action="store_true",
            help="watch the run live in this terminal while it trains (traceview watch): the "
            "job's own output goes to RUN/job.log, its last lines in a pane; q leaves the "
            "screen, the job runs on",
        )
        parser.add_argument(
            "--keep",
            action="store_true",
            help="keep the run directory even when the job left nothing in it",
        )
        parser.add_argument(
            "command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the job to run"
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.collectors.launch import (
            CollectSettings,
            JobNotStarted,
            default_run_dir,
            prepare_run,
            run_job,
        )
        from traceview.collectors.rankside import STARTED
        from traceview.store import rundir as R

        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            raise UsageError(
                "give the job's command after --, e.g. traceview collect -- mpirun -np 2 python train.py"
            )
        if min(args.steps, 1) < 1 or args.warmup < 0 or args.skip < 0:
            raise UsageError("--steps must be at least 1, --warmup and --skip at least 0")
        if args.stall is not None and not 0 < args.stall < 1e7:
            raise UsageError("--stall must be a number of seconds above 0")
        from traceview.store import outputs

        run = outputs.run_directory(args.output or default_run_dir(), empty=True)
        settings = CollectSettings(
            steps=args.steps,
            warmup=args.warmup,
            skip=args.skip,
            nvtx=args.nvtx,
            profile_memory=args.memory,
        )
        if args.max_profile_memory is not None:
            settings.max_memory = args.max_profile_memory
        if args.stall is not None:
            settings.stall_s = args.stall
        if args.live and not (sys.stdout.isatty() and sys.stdin.isatty()):
            raise UsageError("--live shows a screen: run it in a terminal (or watch RUN from one)")
        existed = run.exists()
        bootstrap = prepare_run(run)  # (what cannot be written there ends here, job unstarted)
        print(f"traceview: profiling every rank into {run}", file=sys.stderr, flush=True)
        screen: list[Any] = []
        try:
            result = run_job(
                command,
                run,
                settings,
                bootstrap,
                output=run / "job.log" if args.live else None,
                started_job=(lambda: screen.append(_open_screen(run))) if args.live else None,
            )
        except JobNotStarted as exc:
            print(f"traceview: error: {safe(exc)}", file=sys.stderr)
            self._remove_empty(run, existed, args.keep)
            return 127
        finally:
            for watch in screen:  # (the user leaves it with q: the job's end does not)
                watch.wait()
        code = result.exit_code
        said = result.stderr_tail
        # what the launcher said last (or the first line of the message Open MPI framed)
        last = f": {safe(said[0] if len(said) > 1 else said[-1], 200)}" if said else ""
        self._say_what_was_ended(result)
        if result.warnings:  # status files the job wrote that did not read: one line
            more = f" (and {len(result.warnings) - 1} more)" if len(result.warnings) > 1 else ""
            print(f"traceview: warning: {safe(result.warnings[0], 300)}{more}", file=sys.stderr)
        full = _full(run)
        traced = any(s.get("trace_present") for s in result.statuses)
        if (
            not traced
            and _recorded_steps(run)
            and self._write_manifest(run, result, settings, quiet=True)
        ):
            # the ranks ran steps and kept their step record, but wrote no profile (the job
            # ended before the window): the record's account is the report
            killed = _killed_while_profiling(result.statuses)
            why = (
                f"rank(s) {', '.join(killed[:10])} were killed while profiling (their status "
                "says so) before writing a trace"
                if killed
                else "no rank wrote a profile"
            )
            print(
                f"traceview: the job exited with code {code} and left nothing to profile: "
                f"{why}{last}",
                file=sys.stderr,
            )
            print("traceview: its step record says what happened", file=sys.stderr)
            if not args.no_report:
                from traceview.commands.report import load_report
                from traceview.views.text import render_to_console

                render_to_console(load_report([run]))
            print(f"traceview: run directory {run} (job exit code {code})", file=sys.stderr)
            return code
        if not result.statuses and result.interrupted and not _any_rank_started(run):
            # interrupted by the user before the job ran: the signal's code, not the launcher's
            removed = self._remove_empty(run, existed, args.keep, quiet=True)
            kept = "removed the empty run directory" if removed else f"kept {run}"
            print(
                f"traceview: interrupted ({result.interrupted}) before any rank of the job "
                f"started: {kept} (the launcher exited with code {code})",
                file=sys.stderr,
            )
            return 128 + int(signal.Signals[result.interrupted])
        if not result.statuses:
            if result.interrupted:
                why = (
                    f"the job was interrupted ({result.interrupted}) before any rank started "
                    f"profiling; it exited with code {code}"
                )
            elif not any((run / R.RAW / STARTED).glob("*")):
                # no Python process of the job ever started: the launcher failed on its own
                why = f"the launcher exited with code {code} before any rank started{last}"
            elif full:
                why = (
                    f"the job exited with code {code} and left nothing to profile: {full}, "
                    "so no rank could write its status and trace there"
                )
            else:
                why = (
                    f"the job exited with code {code} and left nothing to profile: no process "
                    f"imported PyTorch, TensorFlow, JAX, MXNet or Chainer and ran a training step{last}"
                )
            print(f"traceview: {why}", file=sys.stderr)
            # (a clean job's record of no step says nothing: not kept for it)
            if not self._remove_empty(run, existed, args.keep, empty_records=code == 0):
                self._write_manifest(run, result, settings, quiet=True)
            return code  # collect exits with the job's exit code
        if not self._write_manifest(run, result, settings, quiet=False):
            return code
        if result.interrupted:
            print(
                f"traceview: the job was interrupted ({result.interrupted}); keeping what the ranks wrote",
                file=sys.stderr,
            )
        if not any(s.get("trace_present") for s in result.statuses):
            killed = _killed_while_profiling(result.statuses)
            if killed:
                which = ", ".join(killed[:10])
                why = (
                    f"rank(s) {which} were killed while profiling (their status says so) before "
                    "writing a trace"
                )
            elif full:
                why = f"{full}, so no rank could write its trace there"
            elif result.interrupted:
                why = "it was interrupted before any rank wrote a profile"
            else:
                why = "no process imported PyTorch, TensorFlow, JAX, MXNet or Chainer and ran a training step"
            print(
                f"traceview: the job exited with code {code} and left nothing to profile: "
                f"{why}{last}",
                file=sys.stderr,
            )
            return code
        from traceview.ingest.large import trim
        from traceview.model.errors import OutputError, TraceviewError

        trim.hand_back_promptly([run])  # (the ranks' traces, before polars loads)
        from traceview.runs import ingest_run

        try:
            ingest_run([run], run, command=sys.argv)
        except OutputError as exc:
            # The run directory cannot take the ingest (a full disk): what the ranks wrote is
            # kept, to be ingested once there is room; the exit code is still the job's.
            print(
                f"traceview: warning: {safe(exc)}; the ranks' traces are kept in {run}/raw "
                f"(traceview ingest {run} reads them once it can be written)",
                file=sys.stderr,
            )
            return code
        except TraceviewError as exc:
            print(f"traceview: error: {safe(exc)}", file=sys.stderr)
            return code or exc.exit_code
        if not args.no_report:
            from traceview.commands.report import load_report
            from traceview.views.text import render_to_console

            render_to_console(load_report([run]))
        print(f"traceview: run directory {run} (job exit code {code})", file=sys.stderr)
        return code

    @staticmethod
    def _say_what_was_ended(result: Any) -> None:
        """One line for the processes of the job that outlived its launcher and were ended (and
        one for any that could not be)."""
        ended, left = result.ended_processes, result.left_running
        if ended:
            pids = ", ".join(map(str, ended[:10])) + (" ..." if len(ended) > 10 else "")
            print(
                f"traceview: {len(ended)} process(es) of the job still ran after the launcher "
                f"ended (pid {pids}): ended them (SIGTERM, then SIGKILL)",
                file=sys.stderr,
            )
        if left:
            pids = ", ".join(map(str, left[:10]))
            print(
                f"traceview: warning: could not end process(es) {pids} of the job", file=sys.stderr
            )

    @staticmethod
    def _write_manifest(run: Path, result: Any, settings: Any, *, quiet: bool) -> bool:
        """Write the run's manifest (the "collect" section); where it cannot be written (a full
        disk), say so in one warning (unless ``quiet``) and return False."""
        from traceview.collectors.launch import collect_manifest
        from traceview.model.errors import OutputError
        from traceview.store import rundir as R

        try:
            R.write_manifest(run, Manifest(collect=collected(collect_manifest(result, settings))))
        except OutputError as exc:
            if not quiet:
                print(
                    f"traceview: warning: {safe(exc)}; what the ranks wrote is kept in {run}/raw "
                    f"(traceview ingest {run} reads it once it can be written)",
                    file=sys.stderr,
                )
            return False
        return True

    @staticmethod
    def _remove_empty(
        run: Path, existed: bool, keep: bool, empty_records: bool = False, quiet: bool = False
    ) -> bool:
        """Remove a run directory collect made that received nothing from the job (only its
        bootstrap; with ``empty_records``, ranks' step records of no step count as nothing),
        unless ``keep``; says so. Whether it was removed."""
        import shutil

        from traceview.collectors.rankside import STARTED
        from traceview.store import rundir as R

        raw = run / R.RAW
        received = raw.is_dir() and any(
            p.name != STARTED and not (empty_records and _no_step_recorded(p))
            for p in raw.iterdir()
        )
        if keep or existed or received or not run.is_dir():
            return False
        shutil.rmtree(run, ignore_errors=True)
        if not quiet:
            print(
                f"traceview: removed {run}: the job left nothing in it (--keep keeps it)",
                file=sys.stderr,
            )
        return True


def _any_rank_started(run: Path) -> bool:
    """Whether any process of the job started with the collector (its marker in raw/)."""
    from traceview.collectors.rankside import STARTED
    from traceview.store import rundir as R

    return any((run / R.RAW / STARTED).glob("*"))


def _open_screen(run: Path) -> Any:
    """The live screen (traceview watch RUN) in this terminal, as a process of its own: the
    job's signals stay collect's to forward."""
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "traceview", "watch", str(run)])


def _killed_while_profiling(statuses: list[dict]) -> list[str]:
    """The ranks whose last status says they were inside the profiling window."""
    return [str(s.get("rank")) for s in statuses if s.get("state") in ("profiling", "stopping")]


#: what a rank's step record holds, and nothing else (rankside_record)
_RECORD_FILES = frozenset(("steps.bin", "calls.bin", "groups.json", "end.json", "stacks.json"))


def _no_step_recorded(folder: Path) -> bool:
    """Whether ``folder`` holds a rank's step record of no step and nothing else."""
    try:
        names = {p.name for p in folder.iterdir()}
        from traceview.collectors.record_rows import has_steps

        return names <= _RECORD_FILES and not has_steps(folder / "steps.bin")
    except OSError:
        return False


def _recorded_steps(run: Path) -> bool:
    """Whether a rank's step record holds a step (not a file a full disk left empty)."""
    try:
        from traceview.collectors.record_rows import has_steps
        from traceview.store import rundir as R

        return any(has_steps(p) for p in (run / R.RAW).glob("rank-*/steps.bin"))
    except OSError:
        return False
