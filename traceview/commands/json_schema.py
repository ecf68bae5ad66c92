"""The JSON Schema of what `report`, `compare`, `scaling --json` or `watch --once --json` prints.

  traceview schema report > report.schema.json

The same schemas are in the repository (docs/schema/). A published key is never removed or
retyped; new keys may appear; data a run does not have is null.
"""

from __future__ import annotations

import argparse
import json


class SchemaCommand:
    name = "schema"
    help = __doc__ or ""

    def prepare(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "command",
            nargs="?",
            default="report",
            choices=["report", "compare", "scaling", "watch"],
            help="whose --json output (default: report)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from traceview.model.results import json_schema

        print(json.dumps(json_schema(args.command), indent=2))
        return 0
