"""Read traces (files, folders, or a run directory's raw/ traces) into a run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traceview.model.escape import safe


class IngestCommand:
    name = "ingest"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "paths", nargs="+", type=Path, metavar="PATH", help="trace files or folders"
        )
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            required=True,
            metavar="RUN",
            help="run directory to write (a run there is replaced whole, at once; while another "
            "ingest writes RUN, this one stops with one line and exit 2, leaving that run)",
        )
        parser.add_argument(
            "--rules",
            type=Path,
            metavar="FILE",
            help="extra classification rules (TOML), tried first",
        )
        parser.add_argument(
            "-j",
            "--jobs",
            type=int,
            default=None,
            help="ranks parsed in parallel on this machine (default: CPUs)",
        )
        parser.add_argument(
            "--scheduler",
            metavar="ADDRESS",
            help="ingest the ranks as tasks on this Dask distributed cluster (e.g. "
            "tcp://10.0.0.1:8786; default: $TRACEVIEW_SCHEDULER, else local processes); its "
            "workers must reach the traces and RUN at the same paths",
        )
        parser.add_argument(
            "--scheduler-file",
            type=Path,
            metavar="FILE",
            help="the scheduler file of a Dask cluster (dask scheduler --scheduler-file FILE)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.ingest.cluster import scheduler_from
        from traceview.runs import ingest_run
        from traceview.store import outputs
        from traceview.store import rundir as R
        from traceview.views.progress import TerminalProgress
        from traceview.views.style import shown_notes

        outputs.run_directory(args.output)

        with TerminalProgress() as progress:
            out = ingest_run(
                args.paths,
                args.output,
                rules_path=args.rules,
                jobs=args.jobs,
                command=sys.argv,
                scheduler=scheduler_from(args.scheduler, args.scheduler_file),
                progress=progress,
            )
        _keep_critical_path(out)
        manifest = R.read_manifest(out)
        for warning in shown_notes(manifest.notes.warnings):
            print(f"traceview: warning: {safe(warning)}", file=sys.stderr)
        events = sum(r.events for r in manifest.ranks)
        workers = len({r.worker for r in manifest.ranks if r.worker})
        on = f" on {workers} Dask worker(s)" if workers else ""
        print(
            f"{safe(str(out))}: {len(manifest.ranks)} rank(s), {events:,} events{on}, "
            f"{manifest.ingest_seconds or 0:.2f} s"
        )
        return 0


def _keep_critical_path(run: Path) -> None:
    """The run's default report once, kept in the run directory for the first `report`
    (``runs.finished``), with its critical path (the part of a report that grows with the ranks:
    PathFile) for the reports with other options. What fails here is the report's to say, when
    one is asked for."""
    from traceview.commands.held import hold_until_exit
    from traceview.commands.report import TOP
    from traceview.ingest.large.trim import release_memory
    from traceview.model.errors import TraceviewError
    from traceview.runs import finished, open_run

    release_memory(now=True)  # what the ingest freed, before the report's own
    key = finished.key_of(run, TOP)
    try:
        with open_run([run]) as opened:
            report = opened.report(TOP)
    except TraceviewError:
        return
    finished.write(run, TOP, report, key)  # (and the report itself, for the first look)
    hold_until_exit(report, opened)
