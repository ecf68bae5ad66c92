"""The README and the documentation pages: what a reader is shown is run, or skipped with a
reason (what is run and compared, and what is changed, is said at the top of tests/docs_pages.py;
tests/integration/test_docs_examples.py and tests/live/test_readme.py run them)."""

from __future__ import annotations

import re

from tests.docs_pages import REPO, SKIPPED, all_commands, output_matches, pages

README = REPO / "README.md"


def test_every_bash_line_is_run_or_skipped_with_a_reason() -> None:
    commands = all_commands()
    texts = {c.text for c in commands}
    assert {c.kind for c in commands} == {"bash", "example", "python"}
    stale = sorted(set(SKIPPED) - texts)
    assert not stale, f"SKIPPED lists lines no page shows any more: {stale}"
    assert all(reason.strip() for reason in SKIPPED.values())


def test_every_example_shows_its_output() -> None:
    empty = [c.where for c in all_commands() if c.kind == "example" and not c.shown]
    assert not empty, f"an example output that shows no output: {empty}"


def test_readme_is_read_in_five_minutes() -> None:
    text = README.read_text()
    lines, words = len(text.splitlines()), len(re.findall(r"\S+", text))
    assert lines < 200, f"README.md has {lines} lines: move the detail to a page of docs/"
    assert words < 1500, f"README.md has {words} words: move the detail to a page of docs/"


def test_the_readme_and_contributing_are_among_the_pages() -> None:
    assert README in pages() and REPO / "CONTRIBUTING.md" in pages()


def test_output_comparison_leaves_out_only_what_an_ellipsis_stands_for() -> None:
    printed = ["a", "b", "c", "d"]
    assert output_matches(("a", "b", "c", "d"), printed)
    assert output_matches(("a", "…", "d"), printed)
    assert output_matches(("a", "..."), printed)
    assert output_matches(("a  ", "b", "…"), printed)  # trailing spaces do not count
    assert not output_matches(("a", "c", "d"), printed)  # a line missing without an ellipsis
    assert not output_matches(("a", "b", "c"), printed)  # the end, without an ellipsis
    assert not output_matches(("a", "…", "x"), printed)
    assert not output_matches(("a", "b", "c", "d", "e"), printed)


def test_links_of_the_readme_and_contributing_lead_to_files() -> None:
    """(The site's own links are checked by `mkdocs build --strict`.)"""
    for page in (README, REPO / "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_python_snippets_import_only_what_pip_install_installs() -> None:
    """A reader runs the pages' Python after `pip install -e .`: a snippet that imports pandas
    (only in the dev extra) fails for them with ModuleNotFoundError."""
    import ast
    import sys

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installed = {re.split(r"[<>=!~;\[ ]", d)[0].lower() for d in project["dependencies"]}
    allowed = installed | set(sys.stdlib_module_names) | {"traceview"}
    wrong = []
    for command in all_commands():
        if command.kind != "python":
            continue
        for node in ast.walk(ast.parse(command.text)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            wrong += [f"{command.where}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not wrong, f"snippets import what `pip install -e .` does not install: {wrong}"
