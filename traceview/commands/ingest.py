"""Read traces (files, folders, or a run directory's raw/ traces) into a run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traceview import rundir as R
from traceview.text import safe


class IngestCommand:
    name = "ingest"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "paths", nargs="+", type=Path, metavar="PATH", help="trace files or folders"
        )
        parser.add_argument(
            "-o", "--output", type=Path, required=True, metavar="RUN", help="run directory to write"
        )
        parser.add_argument(
            "--rules",
            type=Path,
            metavar="FILE",
            help="extra classification rules (TOML), tried first",
        )
        parser.add_argument(
            "-j", "--jobs", type=int, default=None, help="ranks parsed in parallel (default: CPUs)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.runs import ingest_run

        out = ingest_run(
            args.paths, args.output, rules_path=args.rules, jobs=args.jobs, command=sys.argv
        )
        manifest = R.read_manifest(out)
        for warning in manifest.notes.warnings:
            print(f"traceview: warning: {safe(warning)}", file=sys.stderr)
        events = sum(r.events for r in manifest.ranks)
        print(
            f"{out}: {len(manifest.ranks)} rank(s), {events:,} events, "
            f"{manifest.ingest_seconds or 0:.2f} s"
        )
        return 0
