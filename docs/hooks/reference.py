"""MkDocs hook: the reference pages that must not drift from the code, generated at build time.

- ``reference/json-schema.md`` from ``docs/schema/{report,compare,scaling}.schema.json`` (the
  published contract of ``--json``, itself checked against the code by tests/unit/test_results.py);
- ``reference/parquet.md`` from the Arrow schemas in ``traceview/model/schema.py``.

The site builds with only ``mkdocs`` and ``mkdocs-material`` installed, so this file imports
neither traceview nor pyarrow: it reads schema.py with :mod:`ast` (the Final string constants,
``pa.schema([...])`` of ``pa.field(...)``, the generator expressions over phase tuples and the
comments beside them). tests/unit/test_docs_site.py holds what it reads equal to the real
pyarrow schemas, field by field.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PY = ROOT / "traceview" / "model" / "schema.py"
#: The phase and segment-kind names schema.py imports (read first, as its import does).
VOCABULARY_PY = ROOT / "traceview" / "model" / "vocabulary.py"
JSON_SCHEMAS = ROOT / "docs" / "schema"

#: Parquet files of a run directory and the schema constant each is written with.
RUN_TABLES: tuple[tuple[str, str], ...] = (
    ("events/rank=N/part-0.parquet", "EVENTS_SCHEMA"),
    ("steps.parquet", "STEPS_SCHEMA"),
    ("ops.parquet", "OPS_SCHEMA"),
    ("collectives.parquet", "COLLECTIVES_SCHEMA"),
    ("comm.parquet", "COMM_SCHEMA"),
    ("gpu.parquet", "GPU_SCHEMA"),
    ("launches.parquet", "LAUNCHES_SCHEMA"),
    ("memory.parquet", "MEMORY_SCHEMA"),
    ("memory_steps.parquet", "MEMORY_STEPS_SCHEMA"),
    ("segments.parquet", "SEGMENTS_SCHEMA"),
)
#: Tables and columns only ``export --format parquet`` writes, and their schema constants.
EXPORT_TABLES: tuple[tuple[str, str], ...] = (
    ("collectives.parquet", "EXPORT_COLLECTIVES_SCHEMA"),
    ("comm_by_group.parquet", "COMM_BY_GROUP_SCHEMA"),
    ("pipeline_stages.parquet", "PIPELINE_STAGES_SCHEMA"),
    ("critical_path.parquet", "CRITICAL_PATH_SCHEMA"),
)

_ARROW_TYPES = {
    "int32": "int32",
    "int64": "int64",
    "float64": "double",
    "string": "string",
    "bool_": "bool",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as pyarrow prints it: int64, string, dictionary<values=string, indices=int32...>
    nullable: bool
    comment: str  # the comment beside the field in schema.py, or beside its name's constant


@dataclass(frozen=True)
class Table:
    constant: str
    doc: str  # the ``#:`` comment above the schema in schema.py
    columns: tuple[Column, ...]


class _Reader:
    """Evaluates the small subset of Python that schema.py's schemas are written in."""

    def __init__(self, source: str, values: dict[str, Any] | None = None) -> None:
        self.lines = source.splitlines()
        self.tree = ast.parse(source)
        self.values: dict[str, Any] = dict(values or {})
        self.comments: dict[str, str] = {}  # constant name -> its trailing comment
        self.docs: dict[str, str] = {}  # constant name -> the #: block above it
        self.functions: dict[str, str] = {}  # one-line f-string helpers: name -> template
        self.schemas: dict[str, list[Column]] = {}
        for node in self.tree.body:
            self._statement(node)

    def _comment(self, lineno: int) -> str:
        line = self.lines[lineno - 1]
        match = re.search(r"#\s?(.*)$", line)
        return match.group(1).strip() if match and not line.lstrip().startswith("#") else ""

    def _doc_above(self, lineno: int) -> str:
        out: list[str] = []
        i = lineno - 2
        while i >= 0 and self.lines[i].startswith("#:"):
            out.insert(0, self.lines[i][2:].strip())
            i -= 1
        return " ".join(out)

    def _statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.FunctionDef) and len(node.args.args) == 1:
            returns = [n for n in node.body if isinstance(n, ast.Return)]
            if returns and isinstance(returns[0].value, ast.JoinedStr):
                self.functions[node.name] = ast.unparse(returns[0].value)
            return
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            name = node.target.id
            self.comments[name] = self._comment(node.lineno)
            self.docs[name] = self._doc_above(node.lineno)
            value = node.value
            if isinstance(value, ast.Call) and _is_call(value, "schema"):
                self.schemas[name] = list(self._fields(value))
                return
            with contextlib.suppress(_Unsupported):  # a constant the schemas do not need
                self.values[name] = self._eval(value)

    def _eval(self, node: ast.expr, scope: dict[str, Any] | None = None) -> Any:
        scope = scope or {}
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in scope:
                return scope[node.id]
            if node.id in self.values:
                return self.values[node.id]
            raise _Unsupported(node.id)
        if isinstance(node, ast.Tuple):
            return tuple(self._eval(e, scope) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            template = self.functions.get(node.func.id)
            if template is None or len(node.args) != 1:
                raise _Unsupported(node.func.id)
            argument = self._eval(node.args[0], scope)
            # the template is an f-string over its one parameter, e.g. f"{phase}_ns"
            return re.sub(r"\{\w+\}", str(argument), template[2:-1])
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self._eval(node.left, scope), self._eval(node.comparators[0], scope)
            if isinstance(node.ops[0], ast.NotEq):
                return left != right
            if isinstance(node.ops[0], ast.Eq):
                return left == right
        raise _Unsupported(ast.unparse(node))

    def _type(self, node: ast.expr) -> str:
        if isinstance(node, ast.Name) and node.id == "_DICT":
            return "dictionary<values=string, indices=int32, ordered=0>"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _ARROW_TYPES
        ):
            return _ARROW_TYPES[node.func.attr]
        if _is_call(node, "list_") and isinstance(node, ast.Call) and len(node.args) == 1:
            return f"list<item: {self._type(node.args[0])}>"
        raise _Unsupported(ast.unparse(node))

    def _field(self, call: ast.Call, scope: dict[str, Any]) -> Column:
        name_node = call.args[0]
        name = self._eval(name_node, scope)
        nullable = True
        for keyword in call.keywords:
            if keyword.arg == "nullable":
                nullable = bool(self._eval(keyword.value, scope))
        comment = self._comment(call.end_lineno or call.lineno)
        if not comment and isinstance(name_node, ast.Name):
            comment = self.comments.get(name_node.id, "")
        return Column(name, self._type(call.args[1]), nullable, comment)

    def _fields(self, schema_call: ast.Call) -> Iterator[Column]:
        (elements,) = schema_call.args
        assert isinstance(elements, ast.List)
        for element in elements.elts:
            if _is_call(element, "field"):
                assert isinstance(element, ast.Call)
                yield self._field(element, {})
            elif isinstance(element, ast.Starred) and isinstance(element.value, ast.Name):
                yield from self.schemas[element.value.id]  # *RAW_SCHEMA
            elif isinstance(element, ast.Starred) and isinstance(element.value, ast.GeneratorExp):
                generator = element.value
                (loop,) = generator.generators
                assert isinstance(loop.target, ast.Name) and _is_call(generator.elt, "field")
                for item in self._eval(loop.iter):
                    scope = {loop.target.id: item}
                    if all(self._eval(test, scope) for test in loop.ifs):
                        assert isinstance(generator.elt, ast.Call)
                        yield self._field(generator.elt, scope)
            else:
                raise _Unsupported(ast.unparse(element))


class _Unsupported(Exception):
    pass


def _is_call(node: ast.expr, attr: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "pa"
    )


def arrow_tables(path: Path = SCHEMA_PY) -> dict[str, Table]:
    """Every ``pa.schema`` constant of schema.py, read without importing pyarrow."""
    names = _Reader(VOCABULARY_PY.read_text()).values
    reader = _Reader(path.read_text(), names)
    return {
        name: Table(name, reader.docs.get(name, ""), tuple(columns))
        for name, columns in reader.schemas.items()
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def parquet_page() -> str:
    tables = arrow_tables()
    out = [
        "# Parquet tables and columns",
        "",
        "<!-- generated by docs/hooks/reference.py from traceview/model/schema.py: "
        "edit the schema, not this page -->",
        "",
        "Every table of a [run directory](run-directory.md), as `traceview/model/schema.py` "
        "declares it (generated when the site is built, so it cannot drift from the code). "
        "Units are part of the column names (`_ns`: nanoseconds, `_bytes`: bytes); every file "
        "carries the schema version in its Parquet metadata (`traceview.schema_version`). "
        "`export RUN --format parquet` writes the same tables. What each figure means is in "
        "the [glossary](../glossary.md).",
        "",
    ]
    for filename, constant in RUN_TABLES:
        out += _table_section(f"## `{filename}`", tables[constant])
    out += [
        "## Tables of `export`",
        "",
        "`export RUN --format parquet` (or `csv`: a list is written as a JSON array) writes the "
        "tables above, `collectives` with more columns, and these where the run has them.",
        "",
    ]
    for filename, constant in EXPORT_TABLES:
        out += _table_section(f"### `{filename}` (export)", tables[constant])
    return "\n".join(out)


def _table_section(heading: str, table: Table) -> list[str]:
    out = [heading, ""]
    if table.doc:
        out += [table.doc, ""]
    out += ["| column | type | null | note |", "|---|---|---|---|"]
    for column in table.columns:
        kind = "dictionary (string)" if column.type.startswith("dictionary") else column.type
        kind = kind.replace("list<item: ", "list of ").removesuffix(">")
        null = "yes" if column.nullable else "no"
        out.append(f"| `{column.name}` | {kind} | {null} | {_cell(column.comment)} |")
    out.append("")
    return out


def _json_type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in spec:
        return " or ".join(_json_type(s) for s in spec["anyOf"])
    if "enum" in spec:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    kind = spec.get("type")
    if kind == "array":
        return f"array of {_json_type(spec.get('items', {}))}"
    if kind == "object" and "additionalProperties" in spec:
        return f"object of {_json_type(spec['additionalProperties'])}"
    return f"{kind}" if kind else "any"


def json_page() -> str:
    out = [
        "# JSON schema of `--json`",
        "",
        "<!-- generated by docs/hooks/reference.py from docs/schema/*.schema.json -->",
        "",
        "Generated when the site is built from the published JSON Schemas in `docs/schema/` "
        "(`traceview schema report|compare|scaling|watch` prints them; tests/unit/test_results.py "
        "fails when the code's output and these files disagree). The rules of the contract "
        "(keys never removed or retyped, `null` for data a run does not have) are on "
        "[the contract page](report-json.md); what each figure means is in the "
        "[glossary](../glossary.md).",
        "",
    ]
    seen: set[str] = set()
    for command in ("report", "compare", "scaling", "watch"):
        schema = json.loads((JSON_SCHEMAS / f"{command}.schema.json").read_text())
        out += [f"## `traceview {command} --json`", "", schema.get("description", ""), ""]
        for name, definition in schema.get("$defs", {}).items():
            if name in seen:
                out += [f"### {name} ({command})", "", f"As [above](#{name.lower()}).", ""]
                continue
            seen.add(name)
            out += [f"### {name}", ""]
            if definition.get("description"):
                out += [definition["description"].replace("``", "`"), ""]
            required = set(definition.get("required", []))
            properties = definition.get("properties", {})
            if not properties:
                out += [f"Type: {_json_type(definition)}", ""]
                continue
            out += ["| key | type | always present |", "|---|---|---|"]
            for key, spec in properties.items():
                present = "yes" if key in required else "no (default `null` where absent)"
                out.append(f"| `{key}` | {_cell(_json_type(spec))} | {present} |")
            out.append("")
    return "\n".join(out)


GENERATED = {
    "reference/parquet.md": parquet_page,
    "reference/json-schema.md": json_page,
}


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (mkdocs 1.6: ``File.generated``)."""
    from mkdocs.structure.files import File

    for uri, make in GENERATED.items():
        files.append(File.generated(config, uri, content=make()))
    return files
