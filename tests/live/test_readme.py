"""The live tier's part of the documentation's tests: every command of the README,
CONTRIBUTING.md and docs/ run as pasted, real jobs included (what is run, changed and skipped,
and why, is said at the top of tests/docs_pages.py)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_pages import REPO, SKIPPED, Command, commands, pages

PLACEHOLDERS = {"PATH": "sample_traces/pytorch/ddp", "TRACES...": "sample_traces/pytorch/ddp"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_run(command: Command) -> str:
    text = command.text
    for placeholder, value in PLACEHOLDERS.items():
        text = re.sub(rf"(?<![\w/]){re.escape(placeholder)}(?![\w/])", value, text)
    if os.geteuid() == 0 and "mpirun " in text and "--allow-run-as-root" not in text:
        text = text.replace("mpirun ", "mpirun --allow-run-as-root ", 1)
    return text


@pytest.mark.mpi
@pytest.mark.torch
def test_readme_commands_run_as_pasted(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU build)")
    pytest.importorskip(
        "xprof", reason="the compare example reads TensorFlow traces: '.[tensorflow]'"
    )
    bindir = Path(sys.executable).parent
    missing = [name for name in ("traceview", "mpirun") if not (bindir / name).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not in {bindir}: pip install -e '.[mpi]' there")
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        ),
        "COLUMNS": "80",
    }
    env.pop("VIRTUAL_ENV", None)
    ran: list[str] = []
    for page in pages():
        folder = tmp_path / page.relative_to(REPO).with_suffix("").as_posix().replace("/", "-")
        folder.mkdir()
        for name in ("sample_traces", "examples", ".venv-mxnet"):
            (folder / name).symlink_to(REPO / name)
        for command in commands(page):
            if command.text in SKIPPED:
                continue
            text = _as_run(command)
            env["MASTER_PORT"] = str(_free_port())
            argv = (
                [sys.executable, "-c", text]
                if command.kind == "python"
                else ["bash", "-o", "pipefail", "-c", text]
            )
            proc = subprocess.run(
                argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300
            )
            where = f"{command.where}: {text}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            assert proc.returncode == 0, where
            assert "Traceback" not in proc.stderr, where
            ran.append(command.text)
    # the job examples ran, and made the runs they name
    assert any("mpirun" in t and "-np 2" in t for t in ran)
    assert any("--oversubscribe -np 4" in t for t in ran)
    assert (tmp_path / "docs-profiling" / "runs" / "np4" / "manifest.json").exists()
    assert (tmp_path / "README" / "runs" / "np2-tables" / "events.parquet").exists()
    assert (tmp_path / "docs-getting-started" / "RUN" / "trace.json.gz").exists()
