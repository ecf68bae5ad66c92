"""The documentation site's structure (mkdocs.yml, docs/): what the build cannot check alone.

- The TUI screenshots in docs/img/tui/ are the snapshot tests' SVGs, byte for byte: a change of
  the TUI that updates the snapshots leaves the docs stale until they are copied
  (``python -m tests.docs_pages --copy-screenshots``).
- The hook that generates the Parquet reference reads traceview/model/schema.py without pyarrow
  (the site builds with only mkdocs and mkdocs-material); what it reads is the real schema.
- ``traceview --help`` and every subcommand's help name their page, and the page is on the site.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

import pytest

from tests.docs_pages import DOCS, REPO, SCREENSHOTS, SNAPSHOTS
from traceview.cli import DOCS_INDEX, DOCS_PAGES, build_parser
from traceview.commands import all_commands
from traceview.model import schema


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "hooks" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_hook"] = module
    spec.loader.exec_module(module)
    return module


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav names (read as text: the unit tier has no YAML parser)."""
    text = (REPO / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return re.findall(r":\s+(\S+\.md)\s*$", nav, flags=re.M)


def test_every_page_is_in_the_navigation_and_every_entry_exists() -> None:
    nav = nav_pages()
    generated = set(_hook().GENERATED)
    on_disk = {
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if "hooks" not in p.relative_to(DOCS).parts
    }
    assert sorted(on_disk - set(nav)) == [], "pages left out of mkdocs.yml's nav"
    assert sorted(set(nav) - on_disk - generated) == [], "nav entries with no page"
    assert generated <= set(nav), "generated reference pages left out of the nav"


def test_tui_screenshots_are_the_snapshots_the_tests_compare() -> None:
    snapshots = {p.name: p.read_bytes() for p in SNAPSHOTS.glob("*.svg")}
    screenshots = {p.name: p.read_bytes() for p in SCREENSHOTS.glob("*.svg")}
    assert snapshots, f"no snapshots in {SNAPSHOTS}"
    stale = sorted(n for n in snapshots if screenshots.get(n) != snapshots[n])
    extra = sorted(set(screenshots) - set(snapshots))
    assert not stale and not extra, (
        f"docs/img/tui/ is stale ({stale}, no longer made: {extra}): "
        "python -m tests.docs_pages --copy-screenshots"
    )
    tui_page = (DOCS / "tui.md").read_text()
    shown = set(re.findall(r"img/tui/([\w.-]+\.svg)", tui_page))
    assert shown == set(snapshots), (
        f"screenshots docs/tui.md does not show: {set(snapshots) - shown}"
    )


@pytest.mark.parametrize(
    "constant", [name for name in vars(schema) if name.endswith("_SCHEMA")], ids=str
)
def test_the_generated_parquet_reference_reads_the_real_schema(constant: str) -> None:
    real = getattr(schema, constant)
    read = _hook().arrow_tables()[constant]
    assert [(c.name, c.type, c.nullable) for c in read.columns] == [
        (f.name, str(f.type), f.nullable) for f in real
    ]


def test_the_generated_parquet_reference_lists_every_table_of_a_run_directory() -> None:
    page = _hook().parquet_page()
    for constant in ("EVENTS_SCHEMA", "STEPS_SCHEMA", "OPS_SCHEMA", "MEMORY_STEPS_SCHEMA"):
        for field in getattr(schema, constant):
            assert f"| `{field.name}` |" in page
    # and what only export writes: the collectives' match and group columns, its own tables
    for name, constant in _hook().EXPORT_TABLES:
        section = page[page.index(f"### `{name}` (export)") :]
        for field in getattr(schema, constant):
            assert f"| `{field.name}` |" in section, (name, field.name)


def test_the_generated_json_reference_lists_every_key_of_the_published_schemas() -> None:
    import json

    page = _hook().json_page()
    for command in ("report", "compare", "scaling", "watch"):
        published = json.loads((REPO / "docs" / "schema" / f"{command}.schema.json").read_text())
        for definition in published["$defs"].values():
            for key in definition.get("properties", {}):
                assert f"| `{key}` |" in page, (command, key)


def test_every_help_names_its_page_and_the_page_is_on_the_site(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nav = set(nav_pages())
    parser = build_parser()
    assert {c.name for c in all_commands()} == set(DOCS_PAGES)
    for argv, page in [([], DOCS_INDEX)] + [([n], p) for n, p in DOCS_PAGES.items()]:
        with pytest.raises(SystemExit):
            parser.parse_args([*argv, "--help"])
        out = capsys.readouterr().out
        assert f"Documentation: {page}" in out, argv
        assert (REPO / page).exists() and page.removeprefix("docs/") in nav, page
