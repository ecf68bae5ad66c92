"""The walls between the stages, read off the source (ast), so a stray import fails here rather
than in review:

  traces -> parsers -> normalize/ingest -> analysis -> results -> views (text, JSON, TUI)

- parsers read formats: they import the schema, the errors, the column helpers they share with
  the core (traceview.arrays) and each other, nothing of the core's stages (classification
  rules, layout and step-inference passes included);
- normalize, ingest and the run directory never import the analysis, the results or a view;
- the analysis imports nothing that draws (rich, textual, the views);
- views render results: no numpy or polars, and of the analysis only its public entry points
  (compare, lanes); the export writes the events table in other formats with Arrow and
  polars, and imports no analysis at all;
- the rank-side collectors run inside the user's job: the standard library and the framework
  being profiled only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

#: Module prefix -> folder in the repository (the pyproject's package-dir mapping).
PACKAGES = {
    "traceview.parsers": REPO / "parsers",
    "traceview.collectors": REPO / "collectors",
    "traceview": REPO / "traceview",
}

#: Walls that the code does not hold yet, each with where it is going. The test fails when one of
#: these imports disappears, so the list only shrinks.
KNOWN_DEBT: set[tuple[str, str]] = set()


def _module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            modules.setdefault(name, path)
    return modules


MODULES = _module_files()


def imports_of(module: str) -> set[str]:
    """Every module ``module`` imports, anywhere in its body (lazy imports count too)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # `from traceview import schema` imports traceview.schema
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    found.add(f"{target}.{alias.name}")
    return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules(*prefixes: str) -> list[str]:
    return sorted(m for m in MODULES if _under(m, prefixes))


def _violations(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for module in modules:
        for target in sorted(imports_of(module)):
            if _under(target, forbidden) and (module, target) not in KNOWN_DEBT:
                out.append(f"{module} imports {target}")
    return out


CORE_STAGES = (
    "traceview.rules",
    "traceview.mxnet_engine",
    "traceview.step_inference",
    "traceview.manifest",
    "traceview.rundir",
    "traceview.normalize",
    "traceview.ingest",
    "traceview.analysis",
    "traceview.results",
    "traceview.open_run",
    "traceview.views",
    "traceview.tui",
    "traceview.commands",
    "traceview.cli",
)
DRAWING = ("rich", "textual", "traceview.views", "traceview.tui")


#: What a parser may import of traceview: the schema, the errors, the column helpers it shares
#: with the core (traceview.arrays) and the other parsers.
PARSER_HELPERS = ("traceview.schema", "traceview.errors", "traceview.arrays", "traceview.parsers")


def test_parsers_only_read_formats() -> None:
    assert not _violations(_modules("traceview.parsers"), CORE_STAGES)
    out = [
        f"{module} imports {target}"
        for module in _modules("traceview.parsers")
        for target in sorted(imports_of(module))
        if _under(target, ("traceview",)) and target != "traceview"
        and not _under(target, PARSER_HELPERS)
    ]  # fmt: skip
    assert not out


def test_the_helpers_parsers_share_import_only_the_schema() -> None:
    for module in ("traceview.arrays", "traceview.errors", "traceview.schema"):
        own = [t for t in imports_of(module) if _under(t, ("traceview",))]
        assert set(own) <= {"traceview", "traceview.schema"}, f"{module} imports {own}"


def test_normalize_and_ingest_never_import_the_analysis_or_a_view() -> None:
    lower = _modules(
        "traceview.normalize", "traceview.ingest", "traceview.rundir", "traceview.arrays",
        "traceview.schema", "traceview.rules", "traceview.mxnet_engine", "traceview.step_inference",
    )  # fmt: skip
    forbidden = ("traceview.analysis", "traceview.results", "traceview.open_run", *DRAWING)
    assert not _violations(lower, forbidden)


def test_the_analysis_draws_nothing() -> None:
    forbidden = (*DRAWING, "traceview.commands", "traceview.cli", "traceview.open_run")
    assert not _violations(_modules("traceview.analysis", "traceview.results"), forbidden)


#: The view that writes the events table itself in other formats (Parquet, CSV, a merged Chrome
#: trace): millions of rows, streamed with Arrow and polars, not rendered from a result.
EXPORT = "traceview.views.export"


def test_views_render_results_without_computing() -> None:
    views = _modules("traceview.views", "traceview.tui")
    public_analysis = (
        "traceview.analysis.compare",
        "traceview.analysis.heatmap",
        "traceview.analysis.lanes",
    )
    out = _violations([m for m in views if m != EXPORT], ("numpy", "polars", "pyarrow.compute"))
    out += _violations([EXPORT], ("traceview.analysis",))
    for module in views:
        for target in imports_of(module):
            if _under(target, ("traceview.analysis",)) and not _under(target, public_analysis):
                out.append(f"{module} imports {target}")
    assert not out


@pytest.mark.parametrize("module", _modules("traceview.collectors"))
def test_rank_side_collectors_import_only_the_standard_library_and_the_framework(
    module: str,
) -> None:
    import sys

    if not module.rpartition(".")[2].startswith("rankside"):
        pytest.skip("runs in the launcher, not inside the job")
    # nvtx: NVIDIA's ranges, imported only where the job's environment has it (GPU runs)
    frameworks = ("torch", "tensorflow", "mxnet", "nvtx")
    own = ("traceview.collectors",)
    out = [
        target
        for target in sorted(imports_of(module))
        if target.split(".")[0] not in sys.stdlib_module_names
        and not _under(target, frameworks + own)
        and target != "__future__"
    ]
    assert not out, f"{module} would import {out} inside the user's job"


def test_known_debt_is_still_debt() -> None:
    """An entry of KNOWN_DEBT that no longer holds is removed from it, so the list shrinks."""
    gone = [pair for pair in KNOWN_DEBT if pair[1] not in imports_of(pair[0])]
    assert not gone, f"remove from KNOWN_DEBT: {gone}"
