"""Arguments more than one command takes."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_runs_argument(parser: argparse.ArgumentParser) -> None:
    """RUN... and their --label, for the commands that take several runs (compare, scaling)."""
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    parser.add_argument(
        "--label",
        action="append",
        metavar="NAME",
        help="a run's name in the output, once per run in order (default: its folder's "
        "name, made unique)",
    )
