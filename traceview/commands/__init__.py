"""Subcommands: each is a small object with a name, its help (the module docstring) and run()."""

from __future__ import annotations

import argparse
from typing import Protocol


class Command(Protocol):
    name: str
    help: str

    def prepare(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def all_commands() -> list[Command]:
    from traceview.commands.collect import CollectCommand
    from traceview.commands.compare import CompareCommand
    from traceview.commands.export import ExportCommand
    from traceview.commands.ingest import IngestCommand
    from traceview.commands.json_schema import SchemaCommand
    from traceview.commands.profile import ProfileCommand
    from traceview.commands.report import ReportCommand
    from traceview.commands.scaling import ScalingCommand
    from traceview.commands.tui import TuiCommand
    from traceview.commands.watch import WatchCommand
    from traceview.commands.whatif import WhatIfCommand

    return [
        CollectCommand(),
        IngestCommand(),
        ReportCommand(),
        CompareCommand(),
        ScalingCommand(),
        WhatIfCommand(),
        ExportCommand(),
        TuiCommand(),
        WatchCommand(),
        ProfileCommand(),
        SchemaCommand(),
    ]
