"""The code base stays lint-clean and type-checked (ruff and mypy, as configured in pyproject)."""

from __future__ import annotations

from tests.conftest import REPO


def test_every_package_is_in_the_wheel() -> None:
    """pyproject lists the packages a (non-editable) install ships: a package missing there
    works from a checkout and fails in a user's `pip install`."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    # Every folder that holds files is a package to setuptools (a namespace package where it
    # has no __init__.py, as parsers/rules): unlisted, it warns during `pip install`.
    roots = {
        "traceview": "traceview",
        "parsers": "traceview.parsers",
        "collectors": "traceview.collectors",
    }
    found = set()
    for folder, package in roots.items():
        for path in [REPO / folder, *(REPO / folder).rglob("*")]:
            if (
                path.is_dir()
                and not path.is_symlink()  # a worktree's traceview/parsers -> ../parsers
                and path.name != "__pycache__"
                and any(f.is_file() for f in path.iterdir())
            ):
                found.add(".".join([package, *path.relative_to(REPO / folder).parts]))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_published_results_name_no_machine_paths() -> None:
    """What is committed for readers (the samples' README, benchmark results) names no path of
    the machine that made it: it means nothing in a clone."""
    import re

    machine = re.compile(r"(?<![\w.])/(?:work|root|tmp|home)/")
    files = [
        REPO / "sample_traces" / "README.md",
        *sorted((REPO / "benchmarks" / "results").iterdir()),
    ]
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if machine.search(line)
    ]
    assert not found, found
