"""The integration tier's part of ``tests/unit/test_step_window.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

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
