"""Shared fixtures: where the real traces are, and helpers to run the CLI as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
SHARED = Path(os.environ.get("TRACEVIEW_SHARED_TRACES", REPO.parent / "shared" / "traces"))


def shared_traces(subdir: str = "") -> Path:
    """The real traces from other people's runs (../shared/traces); skip when absent."""
    path = SHARED / subdir
    if not path.exists():
        pytest.skip(
            f"shared traces not found at {path} (they live beside the repository, not in it)"
        )
    return path


def shared_pytorch_files() -> list[Path]:
    root = SHARED / "pytorch"
    return sorted(root.rglob("*.json.gz")) if root.exists() else []


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


def run_cli(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Result:
    """Run ``python -m traceview`` in a subprocess, exactly as a user's shell would."""
    proc = subprocess.run(
        [sys.executable, "-m", "traceview", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
        timeout=600,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli
