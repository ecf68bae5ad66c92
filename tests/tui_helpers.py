"""Shared by the TUI tests: sample runs as run directories, an app that has finished loading."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from tests.conftest import SAMPLES
from traceview.runs import ingest_run

#: A name no terminal should ever act on: an OSC title change, a screen clear, Rich markup and a
#: right-to-left override, as an event and a thread could be named in someone's trace.
EVIL = "\u001b]2;PWNED\u0007\u001b[2J[bold]x[/bold]\u202edesrever"
EVIL_JSON = r"\u001b]2;PWNED\u0007\u001b[2J[bold]x[/bold]\u202edesrever"


def sample_run(name: str, root: Path) -> Path:
    """``sample_traces/pytorch/NAME`` ingested into ``root/NAME`` (the run's label is NAME)."""
    out = root / name
    if not out.exists():
        ingest_run([SAMPLES / "pytorch" / name], out)
    return out


def evil_run(root: Path) -> Path:
    """The DDP sample with ``aten::mm`` and a gloo thread renamed to ``EVIL``."""
    out = root / "evil"
    if out.exists():
        return out
    traces = root / "evil-traces"
    traces.mkdir(parents=True, exist_ok=True)
    for source in sorted((SAMPLES / "pytorch" / "ddp").glob("rank-*.json.gz")):
        with gzip.open(source, "rt") as f:
            text = f.read()
        text = text.replace('"name": "aten::mm"', f'"name": "aten::mm{EVIL_JSON}"')
        text = text.replace("(pt_gloo_runloop)", f"(gloo{EVIL_JSON})")
        (traces / source.name.removesuffix(".gz")).write_text(text)
    ingest_run([traces], out)
    return out


async def loaded(pilot: Pilot[None]) -> None:
    """Wait until the overview shows the run and every worker (lanes included) is done."""
    app = pilot.app
    await app.ready.wait()  # type: ignore[attr-defined]
    await settle(pilot)


async def settle(pilot: Pilot[None]) -> None:
    """Let running workers finish and their messages be handled."""
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def play(
    app: Any, scenario: Callable[[Any, Pilot[None]], Awaitable[None]], size: tuple[int, int]
) -> None:
    """Run ``app`` headless at ``size``, wait until it has loaded, then play ``scenario``."""
    app.animation_level = "none"  # the tabs' underline would slide for a while on every switch

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await loaded(pilot)
            await scenario(app, pilot)

    asyncio.run(main())
