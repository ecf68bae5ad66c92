"""Where each step's time goes: the per-step breakdown per rank and for the run.

PATH is a run directory, a folder of traces, or trace files (read into a temporary run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from traceview import rundir as R


def load_report(paths: list[Path], rules: Path | None = None, top: int = 10) -> dict:
    """The report object for a run directory, or for traces read into a temporary run."""
    from traceview.analysis.summary import summarize
    from traceview.ingest import ingest

    if (
        len(paths) == 1
        and R.is_run_dir(paths[0])
        and (paths[0] / R.STEPS).exists()
        and rules is None
    ):
        run = paths[0]
        return summarize(
            R.read_steps(run), R.read_ops(run), {**R.read_manifest(run), "path": str(run)}, top
        )
    with tempfile.TemporaryDirectory(prefix="traceview-") as tmp:
        run = ingest(paths, Path(tmp) / "run", rules_path=rules, command=sys.argv)
        manifest = {**R.read_manifest(run), "path": None}
        return summarize(R.read_steps(run), R.read_ops(run), manifest, top)


class ReportCommand:
    name = "report"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
        parser.add_argument(
            "--json", action="store_true", help="print the report as one JSON object"
        )
        parser.add_argument("--top", type=int, default=10, help="operators to list (default 10)")
        parser.add_argument(
            "--rules", type=Path, metavar="FILE", help="extra classification rules (TOML)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.report import render_to_console, to_json

        report = load_report(args.paths, args.rules, args.top)
        if args.json:
            print(to_json(report))
        else:
            render_to_console(report, top=args.top)
        return 0
