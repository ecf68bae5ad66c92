"""A loop of links given to every command that reads, as the argument and above it (the default
tier tries two of the pairs): ``python -m pytest -m fuzz tests/fuzz/test_input_places.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_input_places import LOOP_COMMANDS, LOOP_PLACES, check_loop, loop

__all__ = ["loop"]  # the fixture, shared


@pytest.mark.parametrize("command", LOOP_COMMANDS)
@pytest.mark.parametrize("where", LOOP_PLACES)
def test_every_loop_of_links_is_a_clean_error(
    command: str, where: str, loop: Path, tmp_path: Path
) -> None:
    check_loop(command, where, loop, tmp_path)
