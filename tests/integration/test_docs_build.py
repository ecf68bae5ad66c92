"""The documentation site builds with `mkdocs build --strict` (as .ci/run builds it), and the
strict build is what catches a page left out of the navigation or a broken link: shown on a copy
of the site's sources with one such fault each."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_pages import REPO

pytest.importorskip("mkdocs", reason="the site needs the dev extra: pip install -e '.[dev]'")
pytest.importorskip("material", reason="the site needs the dev extra: pip install -e '.[dev]'")


def build(root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


def sources(tmp_path: Path) -> Path:
    """What the build reads: mkdocs.yml, docs/ (with the hook), CONTRIBUTING.md, schema.py and
    the vocabulary it imports."""
    root = tmp_path / "src"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root)
    shutil.copy(REPO / "CONTRIBUTING.md", root)
    (root / "traceview" / "model").mkdir(parents=True)
    for name in ("schema.py", "vocabulary.py"):  # (the hook reads the names schema imports)
        shutil.copy(REPO / "traceview" / "model" / name, root / "traceview" / "model")
    return root


def test_the_site_builds_strict(tmp_path: Path) -> None:
    proc = build(REPO, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "reference" / "parquet" / "index.html").exists()
    assert "comm_exposed_ns" in (site / "reference" / "parquet" / "index.html").read_text()
    assert "straggler_rank" in (site / "reference" / "json-schema" / "index.html").read_text()
    assert (site / "img" / "tui" / "test_timeline_80x24.svg").exists()


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path: Path) -> None:
    root = sources(tmp_path)
    (root / "docs" / "orphan.md").write_text("# A page nobody links\n")
    proc = build(root, tmp_path)
    assert proc.returncode != 0
    assert "orphan.md" in proc.stderr


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    root = sources(tmp_path)
    page = root / "docs" / "glossary.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    proc = build(root, tmp_path)
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr
