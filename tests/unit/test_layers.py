"""The walls between the stages, read off the source (ast), so a stray import fails here rather
than in review. The flow, one way:

  collect -> parsers -> normalize -> store -> ingest, analysis -> runs -> views / tui -> commands, cli

Every module of the package belongs to one layer below (the longest prefix that names it) and
imports of traceview only what its layer allows; an import inside a function or under
TYPE_CHECKING counts, and so does a relative one. A module no layer names fails, so a new
package is given its wall when it is made. And no import cycle among product modules.

- the model (schema, results, manifest, errors, column helpers) imports no stage;
- parsers read formats: the model and each other;
- normalize classifies and nests events: the model, the rules and the parsers' shared types;
- ingest reads traces into a run directory; its large-trace path (``ingest.large``) runs the
  per-rank analysis it is handed, never importing one;
- the run directory (``store``) imports only the model: persistence, never a stage;
- ``runs`` is where ingest and the analysis meet (a run as commands read it: opened, its cache
  checked, re-analysed);
- the analysis imports the model only: it draws nothing and reads no files;
- views and the TUI render results: of the analysis only its public entry points, no numpy or
  polars (the export writes the events table in other formats with Arrow and polars, and
  imports no analysis at all);
- the rank-side collectors run inside the user's job: the standard library and the framework
  being profiled only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

#: Module prefix -> folder in the repository (the pyproject's package-dir mapping).
PACKAGES = {
    "traceview.parsers": REPO / "parsers",
    "traceview.collectors": REPO / "collectors",
    "traceview": REPO / "traceview",
}


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
    """Every module ``module`` imports, anywhere in its body (lazy imports count too); a
    package's ``__init__`` counts for ``from package import module``."""
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
            # `from traceview.model import schema` imports traceview.model.schema (and the
            # package's __init__, which holds no code: not counted)
            modules = {f"{target}.{a.name}" for a in node.names} & MODULES.keys()
            found |= modules
            if len(modules) < len(node.names):
                found.add(target)
    return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _own(module: str) -> set[str]:
    """The product modules ``module`` imports (packages included), not itself."""
    return {t for t in imports_of(module) if t in MODULES and t != module}


MODEL = ("traceview.model",)
#: Of the model, parsers use the tables, errors and column helpers (not results or manifest).
PARSERS = (
    "traceview.model.schema", "traceview.model.vocabulary", "traceview.model.errors",
    "traceview.model.columns", "traceview.parsers",
)  # fmt: skip
NORMALIZE_BASE = (*MODEL, *PARSERS)
NORMALIZE = (*NORMALIZE_BASE, "traceview.normalize")
RUNDIR = (*MODEL, "traceview.store.rundir", "traceview.store.names")
#: (the run directory's file names: what store.rundir itself imports, without pyarrow)
INGEST = (
    *NORMALIZE, "traceview.store.rundir", "traceview.store.names", "traceview.store.outputs",
    "traceview.ingest",
)  # fmt: skip
ANALYSIS = (*MODEL, "traceview.analysis")
#: What a view may call of the analysis: its public entry points for the views.
PUBLIC_ANALYSIS = (
    "traceview.analysis.compare",
    "traceview.analysis.heatmap",
    "traceview.analysis.lanes",
)
RENDER = (*MODEL, "traceview.views", *PUBLIC_ANALYSIS)

#: The step record's format, where the ranks write it (rank side, standard library) and as numpy
#: reads its rows (what watching a run needs, without pyarrow)
RECORD = ("traceview.collectors.rankside_record", "traceview.collectors.record_rows")

#: Layer (module prefix; the longest that names a module wins) -> what of traceview it may
#: import. Packages' ``__init__`` modules count as their package.
LAYERS: dict[str, tuple[str, ...]] = {
    "traceview": ("traceview",),  # __init__: the version only
    "traceview.__main__": ("traceview.cli",),
    "traceview.model": ("traceview", *MODEL),  # (__version__)
    # the helpers parsers share with the core import only the schema (and the names in it)
    "traceview.model.vocabulary": (),
    "traceview.model.schema": ("traceview.model.vocabulary",),
    "traceview.model.errors": ("traceview.model.schema",),
    "traceview.model.columns": ("traceview.model.schema",),
    "traceview.parsers": PARSERS,
    # the step record's reader reads the format where the ranks write it (standard library)
    "traceview.parsers.record": (
        *PARSERS,
        "traceview.collectors.rankside_record",
        "traceview.collectors.record_rows",
    ),
    "traceview.normalize": NORMALIZE,
    "traceview.ingest": ("traceview", *INGEST),
    "traceview.ingest.large": INGEST,
    "traceview.store": RUNDIR,
    "traceview.store.rundir": RUNDIR,
    # the step record's rows as numpy reads them (what watching a run needs, without pyarrow)
    "traceview.collectors.record_rows": (*MODEL, "traceview.collectors.rankside_record"),
    # (and the code that computed a kept report: runs/finished.py reads traceview's modules)
    "traceview.runs": (
        "traceview",
        *INGEST,
        *ANALYSIS,
        "traceview.store",
        "traceview.runs",
        *RECORD,
    ),
    "traceview.analysis": ANALYSIS,
    "traceview.views": RENDER,
    # (writes what it renders: through the run directory's store, and a special file, a named
    # pipe, opened in place as the output places are)
    "traceview.views.export": (
        *MODEL,
        "traceview.views",
        "traceview.store.rundir",
        "traceview.store.outputs",
    ),
    "traceview.tui": (*RENDER, "traceview.tui", "traceview.runs"),
    "traceview.commands": ("traceview",),  # the commands wire every stage together
    "traceview.cli": ("traceview",),
    # the launcher, in traceview's process; the rank side is checked below (standard library)
    "traceview.collectors": ("traceview", "traceview.collectors", "traceview.store.rundir"),
}


def layer_of(module: str) -> str | None:
    named = [prefix for prefix in LAYERS if _under(module, (prefix,))]
    return max(named, key=len) if named else None


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if layer_of(m) is None] == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_what_it_may(layer: str) -> None:
    allowed = LAYERS[layer]
    out = [
        f"{module} imports {target}"
        for module in sorted(MODULES)
        if layer_of(module) == layer
        for target in sorted(_own(module))
        if not _under(target, allowed) and not (target == "traceview" and "traceview" in allowed)
    ]
    assert not out


def test_the_layers_hold_what_they_say() -> None:
    """The walls the module doc names, spelled out: these pairs must never appear."""
    forbidden = {
        "traceview.model": ("traceview.parsers", "traceview.normalize", "traceview.ingest",
                            "traceview.store", "traceview.analysis", "traceview.views"),
        "traceview.ingest.large": ("traceview.analysis", "traceview.runs"),
        "traceview.ingest": ("traceview.runs",),
        "traceview.store": ("traceview.ingest", "traceview.analysis", "traceview.runs"),
        "traceview.analysis": ("rich", "textual", "traceview.views", "traceview.tui",
                               "traceview.store", "traceview.ingest", "traceview.commands"),
        "traceview.parsers": ("traceview.normalize", "traceview.ingest", "traceview.store"),
    }  # fmt: skip
    out = [
        f"{module} imports {target}"
        for prefix, walls in forbidden.items()
        for module in MODULES
        if _under(module, (prefix,))
        for target in imports_of(module)
        if _under(target, walls)
    ]
    assert not out


#: The view that writes the events table itself in other formats (Parquet, CSV, a merged Chrome
#: trace, with the analysis's tracks): millions of rows, streamed with Arrow and polars, not
#: rendered from a result.
EXPORT = ("traceview.views.export", "traceview.views.chrome_tracks")


def test_views_render_results_without_computing() -> None:
    views = [m for m in MODULES if _under(m, ("traceview.views", "traceview.tui"))]
    out = [
        f"{module} imports {target}"
        for module in views
        if module not in EXPORT
        for target in imports_of(module)
        if _under(target, ("numpy", "polars", "pyarrow.compute"))
    ]
    assert not out


def import_cycles() -> list[list[str]]:
    """The strongly connected groups of more than one module in the import graph (Tarjan's
    algorithm, iterative); a package's ``__init__`` is a node of its own."""
    graph = {m: sorted(_own(m)) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, edge = work.pop()
            if edge == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if edge < len(graph[node]):
                work.append((node, edge + 1))
                nxt = graph[node][edge]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return groups


def test_no_import_cycle() -> None:
    assert import_cycles() == []


def test_the_cycle_finder_finds_a_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    monkeypatch.setattr(sys.modules[__name__], "MODULES", dict.fromkeys(fake, Path()))
    monkeypatch.setattr(sys.modules[__name__], "_own", lambda m: fake[m])
    assert import_cycles() == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if _under(m, ("traceview.collectors",)))
)
def test_rank_side_collectors_import_only_the_standard_library_and_the_framework(
    module: str,
) -> None:
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


def test_an_ingest_and_its_analysis_never_import_pandas_yet_to_pandas_works() -> None:
    """pyarrow imports pandas (where installed: half a second and more) on its first array,
    only to ask whether its input is a pandas object; traceview skips that probe
    (``schema._skip_pandas_probe``). In a fresh interpreter: a sample trace ingested and
    analysed, and no pandas imported; asked for pandas, pyarrow still gives it."""
    pytest.importorskip("pandas")
    code = """
import sys, tempfile
from pathlib import Path
from traceview.runs import ingest_run
trace = Path("sample_traces/pytorch/ddp/rank-0.pt.trace.json.gz")
with tempfile.TemporaryDirectory() as out:
    ingest_run([trace], Path(out) / "run", jobs=1)
assert "pandas" not in sys.modules, "pandas imported"
import pyarrow as pa
frame = pa.table({"a": [1, None]}).to_pandas()
assert type(frame).__module__.startswith("pandas"), type(frame)
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
