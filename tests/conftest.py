"""Shared fixtures: where the real traces are, and helpers to run the CLI as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest

if TYPE_CHECKING:
    from traceview.parsers import Parser
    from traceview.store.analysed import Run

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


def analysed(run: Path) -> Run:
    """A run directory's per-rank analysis tables (``.steps``, ``.ops``...) as every command
    reads them (``open_run``: the cached tables where current, recomputed where not)."""
    from traceview.store.analysed import open_run

    with open_run([run]) as opened:
        return opened


def parser_of(path: Path) -> Parser | None:
    """The parser ``ingest`` picks for the trace file ``path`` (``ingest.discover``); None
    where no parser reads it."""
    from traceview.ingest.discover import discover
    from traceview.model.errors import BadInput, Notes
    from traceview.parsers import parser_named

    try:
        (trace,) = discover([path], Notes())
    except BadInput:
        return None
    return parser_named(trace.parser)


def steps_with_timers(run: Path, truth_dir: Path) -> pl.DataFrame:
    """A run's steps table (times in ms, as ``<phase>_tv``) joined to the profiled records of
    the ground truth beside its traces, on rank and step; every step must have its timer."""
    from traceview.model import schema as S

    truth = json.loads((truth_dir / "groundtruth.json").read_text())
    timers = pl.DataFrame([r for r in truth["records"] if r["profiled"]])
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    steps = steps.with_columns(
        (pl.col(c) / 1e6).alias(c.removesuffix("_ns") + "_tv")
        for c in steps.columns
        if c.endswith("_ns")
    )
    joined = steps.join(timers, on=[S.RANK, S.STEP], how="inner")
    assert joined.height == timers.height == steps.height, (
        f"every profiled step has a window and a timer: {steps.height} windows, "
        f"{timers.height} timed steps, {joined.height} matched"
    )
    return joined


# --- the TUI tests' sample runs (ingested once per session, shared read-only) ------------------


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tui-runs")


@pytest.fixture(scope="session")
def ddp(runs_root: Path) -> Iterator[Any]:
    from tests.tui_helpers import sample_run
    from traceview.store.analysed import open_run

    with open_run([sample_run("ddp", runs_root)]) as run:
        yield run


@pytest.fixture(scope="session")
def explicit(runs_root: Path) -> Iterator[Any]:
    from tests.tui_helpers import sample_run
    from traceview.store.analysed import open_run

    with open_run([sample_run("explicit", runs_root)]) as run:
        yield run
