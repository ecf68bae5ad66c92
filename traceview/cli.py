"""traceview: where each training step's time goes, on every rank, and what would make it faster.

Profile a job, or point it at the profiler traces of a run (one file per rank, or a folder):

  traceview collect -- mpirun -np 4 python train.py   profile every rank, then report
  traceview report TRACES...|RUN        breakdown, bottleneck, straggler, wait vs transfer,
                                        memory peaks, why a GPU idles
  traceview ingest TRACES... -o RUN     keep the normalized run (Parquet) for later
                                        (--scheduler ADDRESS: on a Dask cluster)
  traceview tui TRACES...|RUN           explore it in the terminal (q quits, ? helps)
  traceview watch RUN                   a job collect runs, live; profile RUN: its next steps
  traceview compare RUN_A RUN_B ...     runs or frameworks side by side, with ratios
  traceview scaling RUN_1 RUN_2 RUN_4   speedup, efficiency, the model's predictions
  traceview whatif RUN --balance        the steps replayed across ranks with a change
  traceview report RUN --html FILE     the report as one HTML file with plots, to share
  traceview export RUN --format chrome  one merged multi-rank trace for Perfetto
  traceview schema report               the JSON Schema of report/compare/scaling/watch --json

Exit codes: 0 ok; 2 usage or bad input (one line on stderr); 1 internal error;
collect exits with the job's code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
from pathlib import Path

from traceview import __version__
from traceview.commands import all_commands
from traceview.ingest import head_start
from traceview.ingest.large import trim
from traceview.model.errors import TraceviewError, cannot_write, no_room
from traceview.model.escape import safe

#: The documentation page of each subcommand (a page of the site built from docs/ by mkdocs).
DOCS_PAGES: dict[str, str] = {
    "collect": "docs/profiling.md",
    "ingest": "docs/reference/run-directory.md",
    "report": "docs/report.md",
    "compare": "docs/compare.md",
    "scaling": "docs/compare.md",
    "whatif": "docs/critical-path.md",
    "export": "docs/share.md",
    "tui": "docs/tui.md",
    "watch": "docs/live.md",
    "profile": "docs/live.md",
    "schema": "docs/reference/report-json.md",
}
DOCS_INDEX = "docs/index.md"


def _docs_line(page: str) -> str:
    return f"Documentation: {page} (the site: mkdocs serve, in a clone of the repository)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="traceview",
        description=__doc__,
        epilog=_docs_line(DOCS_INDEX),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"traceview {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in all_commands():
        summary = command.help.strip().splitlines()[0] if command.help.strip() else ""
        child = sub.add_parser(
            command.name,
            help=summary,
            description=command.help,
            epilog=_docs_line(DOCS_PAGES[command.name]),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.prepare(child)
        child.set_defaults(handler=command)
    return parser


def _return_memory_promptly() -> None:
    """Arrow's default allocator keeps freed memory for reuse; the system allocator hands large
    blocks back at once, which keeps a one-shot command's peak memory near its working set
    (set now where pyarrow is imported already, and for when it is, where a command imports it
    only if it needs it: ``Command.arrow_later``)."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    if "pyarrow" in sys.modules:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())


def _inputs(args: argparse.Namespace) -> list[Path]:
    """The traces or runs a command reads (what ``trim.hand_back_promptly`` sizes)."""
    paths = getattr(args, "paths", None) or getattr(args, "runs", None)
    run = getattr(args, "run", None)
    return list(paths) if paths else [run] if isinstance(run, Path) else []


_ARROW = ("pyarrow", "numpy", "polars")


def _cannot_import(exc: ImportError) -> int:
    print(
        f"traceview: error: this Python cannot import pyarrow ({safe(exc)}); run "
        "traceview from an environment where it can (traceview.collectors alone needs "
        "nothing)",
        file=sys.stderr,
    )
    return 2


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of what could not be written
    does not fail a second time at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


#: Commands that read no Arrow table (--help and these start without pyarrow: a look at a
#: running job answers at once)
NO_ARROW = frozenset(("watch", "profile"))


class Interrupted(BaseException):
    """SIGTERM or SIGHUP while traceview does its own work (SIGINT is KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP end traceview as Ctrl-C does: one line, exit 128 + the signal
    (collect hands them to the job while it runs, and restores these after)."""

    def stop(signum: int, frame: object) -> None:
        # one is enough: a second (GNU timeout signals the process and then its group) would
        # break into the first one's ending with a traceback
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # (not the main thread: left alone)
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, stop)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    _return_memory_promptly()
    trim.hand_back_promptly(_inputs(args))
    if args.handler.name not in NO_ARROW and not getattr(args.handler, "arrow_later", False):
        try:
            import pyarrow  # noqa: F401 (here, where it cannot be imported: one line)
        except ImportError as exc:  # e.g. pyarrow built for NumPy 2 where NumPy 1 is
            return _cannot_import(exc)
    if paths := getattr(args, "paths", None):  # (traces to read: begin the slowest part now)
        head_start.begin(paths)
    _stop_on_signals()
    try:
        code = int(args.handler.run(args))
        sys.stdout.flush()  # here, where a full disk behind a redirection is caught
        return code
    except TraceviewError as exc:
        print(f"traceview: error: {safe(exc)}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(
            f"traceview: interrupted ({signal.Signals(signum).name}): what was written whole is "
            "kept, nothing half-written (traceview writes each file whole or not at all)",
            file=sys.stderr,
        )
        return 128 + signum
    except BrokenPipeError:
        _discard_stdout()
        return 0
    except Exception as exc:  # an internal error: one line unless asked for the traceback
        if isinstance(exc, ImportError) and (exc.name or "").partition(".")[0] in _ARROW:
            return _cannot_import(exc)  # (a command that imports pyarrow once it needs it)
        if isinstance(exc, OSError) and no_room(exc):
            # Output that does not fit (stdout redirected to a full disk, a file-size limit):
            # the environment, not traceview; the files traceview writes itself name their path.
            _discard_stdout()
            print(f"traceview: error: {safe(cannot_write('output', exc))}", file=sys.stderr)
            return 2
        if os.environ.get("TRACEVIEW_DEBUG"):
            traceback.print_exc()
        else:
            print(
                f"traceview: internal error: {type(exc).__name__}: {safe(exc)} "
                "(set TRACEVIEW_DEBUG=1 for the traceback)",
                file=sys.stderr,
            )
        return 1
    finally:
        head_start.end()


def run() -> None:
    """The ``traceview`` command: ``main``, then an exit that skips the interpreter's teardown
    (0.1-0.2 s after a big ingest, spent freeing what the process is about to lose anyway).
    Every file is written and closed, and every child waited for, when ``main`` returns."""
    try:
        code = main()
    except SystemExit as exc:  # (--help, --version, usage errors)
        if not isinstance(exc.code, int | None):
            raise
        code = exc.code or 0
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a full disk: main said so
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
