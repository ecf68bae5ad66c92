"""The TUI timeline reads one step of a rank from its events file's row groups (issue 15): the
lanes cut from that window equal the lanes cut from every event of the rank, on every sample
run, and the window reads only part of the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SAMPLES, beyond_unit
from tests.unit.test_step_window import (
    SAMPLE_RUNS,
    _a_steps_window_cuts_the_same_lanes_as_all_events,
)


@pytest.mark.parametrize("sample", beyond_unit(SAMPLE_RUNS, lambda s: (SAMPLES / s,)))
def test_a_steps_window_cuts_the_same_lanes_as_all_events(sample: str, tmp_path: Path) -> None:
    _a_steps_window_cuts_the_same_lanes_as_all_events(sample, tmp_path)
