"""The results each command prints with ``--json``, and their JSON Schema
(docs/schema/COMMAND.schema.json)."""

from __future__ import annotations

from typing import Any

import msgspec

from traceview.model.results.base import RESULTS_VERSION, Result
from traceview.model.results.compare import Comparison
from traceview.model.results.live import LiveSnapshot
from traceview.model.results.report import RunReport
from traceview.model.results.scaling import Scaling

#: The results a command prints with ``--json``, by command.
JSON_RESULTS: dict[str, type[Result]] = {
    "report": RunReport,
    "compare": Comparison,
    "scaling": Scaling,
    "watch": LiveSnapshot,  # (watch --once --json)
}


def json_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of ``traceview COMMAND --json`` (docs/schema/COMMAND.schema.json)."""
    schema: dict[str, Any] = _clean_descriptions(msgspec.json.schema(JSON_RESULTS[command]))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"traceview {command} --json",
        "description": f"The object `traceview {command} --json` prints (results version "
        f"{RESULTS_VERSION}). Keys are never removed or retyped once published; data a run "
        "does not have is null.",
        **schema,
    }


def _clean_descriptions(node: Any) -> Any:
    """Every ``description`` (a docstring) without the indentation its source gave it, as
    ``inspect.cleandoc`` leaves it, whichever release of msgspec wrote the schema (0.23 strips
    it, earlier ones kept it)."""
    import inspect

    if isinstance(node, dict):
        return {
            key: inspect.cleandoc(value)
            if key == "description" and isinstance(value, str)
            else _clean_descriptions(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_clean_descriptions(value) for value in node]
    return node
