"""Export a run: Parquet or CSV tables, one merged Chrome trace (one process per rank) for Perfetto, or the report as one HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from traceview.commands.arguments import add_step_arguments, add_window_argument, step_choice_of
from traceview.model.errors import Notes, UsageError
from traceview.model.escape import safe

if TYPE_CHECKING:
    from traceview.store.outputs import OutputFile


def _where(target: OutputFile) -> TextIO:
    """Where to say what was written: stderr when the trace itself went to a special file
    (``-o /dev/stdout`` pipes the trace; the count must not land in it)."""
    return sys.stderr if target.special else sys.stdout


class ExportCommand:
    name = "export"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "run", type=Path, metavar="RUN", help="run directory (from `traceview ingest`)"
        )
        parser.add_argument(
            "--format",
            choices=("parquet", "csv", "chrome", "html"),
            default="parquet",
            help="tables (events, steps, ops, collectives, critical_path; comm_by_group and "
            "pipeline_stages where the run has them; gpu, launches, launches_by_phase and launches_by_rank on "
            "GPU runs) as Parquet or CSV, one merged Chrome trace, or the report as one "
            "self-contained HTML page (default parquet)",
        )
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            metavar="PATH",
            help="folder for parquet/csv (default RUN/export: empty or a previous export), file for "
            "chrome (default RUN/trace.json.gz; a device or named pipe is written in place: a "
            "pipe with no reader waits for one, as `cat > fifo` does) or html (default "
            "RUN/report.html)",
        )
        add_step_arguments(parser)
        add_window_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        from traceview.runs import open_run
        from traceview.store import outputs
        from traceview.store import rundir as R
        from traceview.views import export
        from traceview.views.progress import TerminalProgress

        choice = step_choice_of(args)
        if choice is not None and args.format == "chrome":
            raise UsageError(
                f"{choice.describe()}: the Chrome trace holds every event; --steps and --skip "
                "mark the steps of the parquet/csv tables (steps.excluded)"
            )
        source = args.run
        from traceview.runs.opening import has_windows

        if args.window is not None or has_windows(args.run):
            from traceview.runs.opening import choose_window  # (of a run collect made)

            source = choose_window(args.run, args.window)[0]
        # (the run itself is its window 0: said, so that opening it does not pick the newest)
        window = 0 if source == args.run and has_windows(args.run) else None
        if not R.is_run_dir(source) or not R.event_ranks(source):
            raise UsageError(f"{source}: not a run directory (make one with `traceview ingest`)")
        # where it goes is checked before any work (a place inside the run directory is never
        # followed out of it through a link)
        default = {"chrome": "trace.json.gz", "html": "report.html"}.get(args.format, "export")
        outputs.inside_run(args.output or source / default, source)
        if args.format in ("chrome", "html"):
            given = args.output is not None
            target = outputs.export_file(args.output or source / default, follow=given)
        else:
            folder = outputs.export_directory(args.output or source / "export")
        with (
            TerminalProgress() as progress,
            # the analysis, recomputed if stale
            open_run([source], progress=progress, choice=choice, window=window) as run,
        ):
            run_id = run.manifest.run_id  # (the events exported are this run's, or left out)
            notes = Notes()
            if args.format == "chrome":  # (written while the run is open: its segments)
                from traceview.analysis.crossrank import matched_table

                count = export.chrome(
                    source,
                    run.steps,
                    target.path,
                    run.clock_offsets(),
                    in_place=target.special,
                    notes=notes,
                    run_id=run_id,
                    matched=matched_table(run.collectives, run.cross),
                    segments=run.segments,
                    path=run.critical_path(),
                )
            elif args.format == "html":
                from traceview.analysis.heatmap import step_matrix

                report = run.report()
                matrix = step_matrix(run.steps) if run.steps.num_rows else None
            else:
                analysis = {**run.export_tables(), **export.report_tables(run.report())}
        if args.format == "html":
            from traceview.commands.report import write_page

            write_page(report, matrix, target, args.output or target.path)
        elif args.format == "chrome":
            shown = safe(str(args.output or target.path))
            print(
                f"{shown}: {count:,} events (open in https://ui.perfetto.dev)", file=_where(target)
            )
        else:
            written = export.tables(source, analysis, folder, args.format, notes, run_id)
            for path in written:
                print(safe(str(path)))
        for warning in notes.warnings:
            print(f"traceview: warning: {safe(warning)}", file=sys.stderr)
        return 0
