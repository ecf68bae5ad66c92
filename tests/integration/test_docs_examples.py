"""Every example output of the README and the documentation (a fenced block that starts with
`$ command`) is what the command prints today, line by line at 80 columns (the rules are at the
top of tests/docs_pages.py). No live job: these read the bundled traces."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_pages import COLUMNS, REPO, SKIPPED, Command, all_commands, output_matches

EXAMPLES = [c for c in all_commands() if c.kind == "example" and c.text not in SKIPPED]


def run_example(command: Command, cwd: Path) -> subprocess.CompletedProcess[str]:
    for name in ("sample_traces", "examples"):
        if not (cwd / name).exists():
            (cwd / name).symlink_to(REPO / name)
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": str(COLUMNS),
    }
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command.text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("command", EXAMPLES, ids=[c.where for c in EXAMPLES])
def test_example_output_is_what_the_command_prints(command: Command, tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "traceview").exists():
        pytest.skip("traceview is not installed beside this Python: pip install -e .")
    if "tensorflow" in command.text or "xplane" in command.text:
        pytest.importorskip("xprof", reason="reads TensorFlow traces: '.[tensorflow]'")
    proc = run_example(command, tmp_path)
    printed = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 0, f"{command.where}: {command.text}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, f"{command.where}\n{proc.stderr[-2000:]}"
    assert output_matches(command.shown, printed), (
        f"{command.where}: `{command.text}` no longer prints what the page shows; what it "
        "prints (at 80 columns), to paste over the page's lines:\n" + "\n".join(printed)
    )
