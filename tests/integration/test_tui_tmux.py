"""End to end in a real terminal: `traceview tui` in a detached tmux session, driven by keys.

tmux runs the command in a 100×30 pseudo-terminal, as a person's shell would; the test sends
keys and reads the pane back (``capture-pane``), i.e. what a person would read on screen. Each
test has its own tmux server (``-L``), so nothing touches the user's sessions.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLES
from tests.tui_helpers import evil_run

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (apt-get install tmux) for the end-to-end check"
)


class Pane:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        proc = subprocess.run(
            [TMUX, "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        return proc.stdout

    def start(self, command: str, width: int = 100, height: int = 30) -> None:
        # After the app ends the shell prints its exit code and waits, so the pane stays to read.
        script = f"{command}; echo traceview-exit=$?; sleep 30"
        self.tmux(
            "new-session", "-d", "-s", "tv", "-x", str(width), "-y", str(height), "sh", "-c", script
        )

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "tv")

    def title(self) -> str:
        return self.tmux("display-message", "-p", "-t", "tv", "#{pane_title}").strip()

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "tv", *keys)

    def wait_for(self, needle: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never appeared on screen; the screen shows:\n{text}")


@pytest.fixture
def pane() -> Iterator[Pane]:
    pane = Pane(f"traceview-test-{os.getpid()}-{time.monotonic_ns()}")
    yield pane
    pane.tmux("kill-server")


def traceview(*args: str | Path) -> str:
    words = [sys.executable, "-m", "traceview", "tui", *map(str, args)]
    return f"cd {shlex.quote(str(REPO))} && " + " ".join(shlex.quote(w) for w in words)


def test_tui_on_sample_traces_in_a_real_terminal(pane: Pane) -> None:
    """Traces (not a run directory): ingested into a temporary run that lives while the app
    runs. Overview, then the timeline (2), then q: the shell gets the terminal back."""
    pane.start(traceview(SAMPLES / "pytorch" / "ddp"))
    screen = pane.wait_for("is the bottleneck")
    assert "traceview · ddp · pytorch · 2 ranks · 5 steps · cpu timeline" in screen
    assert "backward is the bottleneck: 58% of the" in screen
    assert "rank 0" in screen and "rank 1" in screen
    pane.keys("2")
    screen = pane.wait_for("training")
    assert "step 3 (2 of 5)" in screen
    assert "▾ rank 0" in screen
    pane.keys("]")
    pane.wait_for("step 4 (3 of 5)")
    pane.keys("q")
    screen = pane.wait_for("traceview-exit=")
    assert "traceview-exit=0" in screen
    assert "Traceback" not in screen


def test_names_from_traces_never_reach_the_terminal_as_escapes(pane: Pane, tmp_path: Path) -> None:
    """An operator named with an OSC title sequence, a screen clear and markup: the pane's
    title stays, the screen shows the escaped name, markup and all."""
    run = evil_run(tmp_path)
    pane.start(traceview(run))
    pane.wait_for("is the bottleneck")
    before = pane.title()
    pane.keys("3")
    screen = pane.wait_for("PWNED")
    assert "\\x1b]2;PWNED\\x07\\x1b[2J[bold]x[/bold]" in screen
    assert pane.title() == before != "PWNED", "the title-setting sequence reached the terminal"
    pane.keys("q")
    assert "traceview-exit=0" in pane.wait_for("traceview-exit=")
