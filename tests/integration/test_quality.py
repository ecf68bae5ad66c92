"""The integration tier's part of ``tests/unit/test_quality.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

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
