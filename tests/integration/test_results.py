"""The result model is the one contract: its JSON Schema only grows, every output reads back into
its struct, and the text report, ``--json`` and the TUI say the same thing about every run (this
one drives the TUI on every sample and shared run: an integration test, like the TUI's own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, beyond_unit, for_unit
from tests.unit.test_results import SAMPLE_RUNS, _text_report, _tui_screens
from traceview.views.style import STRAGGLER_WAIT_SAID


@pytest.mark.parametrize(
    "sample",
    [
        *for_unit(SAMPLE_RUNS, lambda s: (SAMPLES / s,)),
        *beyond_unit(SAMPLE_RUNS, lambda s: (SAMPLES / s,)),
    ],
)
def test_text_json_and_tui_give_the_same_verdicts(sample: str, tmp_path: Path) -> None:
    from traceview.runs import ingest_run, open_run

    run_dir = ingest_run([SAMPLES / sample], tmp_path / "run")
    with open_run([run_dir]) as run:
        report = run.report()
        as_json = json.loads(report.to_json())
        text = _text_report(report)
        tui = _tui_screens(run)
    summary = as_json["summary"]
    bottleneck = summary["bottleneck"]
    verdict = f"{bottleneck} is the bottleneck: {100 * summary['bottleneck_share']:.0f}% of the"
    # the cause first (or that the run is balanced), then the bottleneck, in both
    after_cause = tui["verdict"].split("\n")[-3:]
    assert verdict in text and any(line.startswith(verdict) for line in after_cause), (
        text,
        tui["verdict"],
    )
    cause = summary["cause"]
    if cause is not None:
        words = " ".join(cause["text"].split()[:6])
        assert tui["verdict"].startswith("cause: ") and words in " ".join(text.split())
    phases = summary["breakdown_ms"]
    if cause is not None and bottleneck in phases and as_json["run"]["synchronous"] is not False:
        # the share above is the cause's saving; the phase's own share (the per-step table's,
        # the breakdown's) is named beside it, so the two never read as one figure
        own = f"{100 * phases[bottleneck] / summary['step_ms']:.0f}%"
        said = f"goes to the cause above ({bottleneck} itself: {own} of the step, mean of ranks)"
        for screen in (text, tui["verdict"]):
            assert said in " ".join(screen.split()), (said, screen)
    if summary["comm_total_ms"] > 0:
        hidden = f"(hidden: {summary['hidden']})"
        assert hidden in text.replace("\n", " ") and hidden in tui["verdict"]
    significant = summary["straggler_significant"]
    marked = [r["rank"] for r in as_json["ranks"] if r["straggler"]]
    if significant:
        assert marked == [summary["straggler_rank"]]
        for screen in (text, tui["notes"]):
            assert "the others wait for it" in screen and "balanced" not in screen
        assert "◀ straggler" in tui["bars"]
        assert f"{summary['straggler_rank']}*" in tui["ranks"]
    else:
        assert marked == []
        assert "◀ straggler" not in tui["bars"] and "*" not in tui["ranks"]
        waited = summary["straggler_wait_ms"] or 0.0
        # a rank the others wait for 20% of the step, no change to which replays to 5%: said so
        replayed_small = significant is False and waited >= STRAGGLER_WAIT_SAID * summary["step_ms"]
        claim = (
            "not known"
            if significant is None
            else "replays to a saving of under 5%"
            if replayed_small
            else "ranks are balanced"
        )
        if summary["straggler_rank"] is not None:  # (None: nothing matched across ranks)
            for screen in (text, tui["notes"]):
                flat = " ".join(screen.split())
                assert claim in flat, (claim, screen)
                assert ("the others wait" in flat) == replayed_small, screen
