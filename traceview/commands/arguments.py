"""Arguments more than one command takes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traceview.model.choice import StepChoice


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


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """--steps and --skip: which steps the figures count (report, compare, scaling, tui,
    export)."""
    parser.add_argument(
        "--steps",
        metavar="A-B",
        help="count only steps A to B, in the trace's own step numbers (ProfilerStep#A); "
        "default: every step but leading warm-up steps (over 1.3x the median of the later ones)",
    )
    parser.add_argument(
        "--skip",
        type=int,
        metavar="N",
        help="leave out the first N steps (of those --steps chose); --skip 0 counts every step, "
        "warm-up included",
    )


def step_choice_of(args: argparse.Namespace) -> StepChoice | None:
    """The steps the command line chose (None: the default selection). UsageError: a range
    that is not one."""
    from traceview.model.choice import step_choice

    return step_choice(args.steps, args.skip)


def add_window_argument(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """--window K: of a run collect made, which profile window (traceview profile asks for
    more while the job runs)."""
    parser.add_argument(
        "--window",
        type=int,
        action="append" if several else "store",
        metavar="K",
        help="of a run collect made, its profile window K (0: the first; K: the K-th asked "
        "with traceview profile); default: the newest complete one"
        + ("; twice with one RUN: compare two windows of it" if several else ""),
    )
