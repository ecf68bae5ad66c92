"""Export a run: Parquet or CSV tables, or one merged Chrome trace (one process per rank) for Perfetto."""

from __future__ import annotations

import argparse
from pathlib import Path

from traceview.model.errors import UsageError
from traceview.store import rundir as R


class ExportCommand:
    name = "export"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "run", type=Path, metavar="RUN", help="run directory (from `traceview ingest`)"
        )
        parser.add_argument(
            "--format",
            choices=("parquet", "csv", "chrome"),
            default="parquet",
            help="tables (events, steps, ops, collectives; gpu and launches on GPU runs) as "
            "Parquet or CSV, or one merged Chrome trace (default parquet)",
        )
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            metavar="PATH",
            help="folder for parquet/csv (default RUN/export), file for chrome (default RUN/trace.json.gz)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.store.analysed import open_run
        from traceview.views import export

        if not R.is_run_dir(args.run) or not R.event_ranks(args.run):
            raise UsageError(f"{args.run}: not a run directory (make one with `traceview ingest`)")
        with open_run([args.run]) as run:  # the analysis tables, recomputed if stale
            if args.format == "chrome":
                steps, offsets = run.steps, run.clock_offsets()
            else:
                analysis = run.export_tables()
        if args.format == "chrome":
            out = args.output or args.run / "trace.json.gz"
            count = export.chrome(args.run, steps, out, offsets)
            print(f"{out}: {count:,} events (open in https://ui.perfetto.dev)")
        else:
            out = args.output or args.run / "export"
            written = export.tables(args.run, analysis, out, args.format)
            for path in written:
                print(path)
        return 0
