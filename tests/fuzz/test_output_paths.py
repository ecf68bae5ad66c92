"""Every output place of tests/integration/test_output_paths.py with every command that writes
(the default tier tries a sample of the places): ``python -m pytest -m fuzz
tests/fuzz/test_output_paths.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_output_paths import COMMANDS, PLACES, check_output_place, run_dir

__all__ = ["run_dir"]  # the fixture, shared


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("what", COMMANDS)
def test_every_output_place_is_checked_before_any_work(
    what: str, place: str, run_dir: Path, tmp_path: Path
) -> None:
    check_output_place(what, place, run_dir, tmp_path)
