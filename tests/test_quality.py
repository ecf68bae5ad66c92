"""The code base stays lint-clean and type-checked (ruff and mypy, as configured in pyproject)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (pip install -e '.[dev]')")
    return path


def test_ruff_is_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean(tmp_path: Path) -> None:
    # parsers/ and collectors/ are installed as traceview.parsers/.collectors (package-dir
    # mapping), which mypy cannot follow: check a tree of links laid out as installed.
    package = tmp_path / "traceview"
    package.mkdir()
    for item in (REPO / "traceview").iterdir():
        if item.name != "__pycache__":
            (package / item.name).symlink_to(item)
    (package / "parsers").symlink_to(REPO / "parsers")
    (package / "collectors").symlink_to(REPO / "collectors")
    proc = subprocess.run(
        [
            _tool("mypy"),
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--no-incremental",
            "-p",
            "traceview",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


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
