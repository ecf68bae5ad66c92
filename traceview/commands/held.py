"""What a command made and is done with, left for the process's exit to drop: ``cli.run`` ends
in ``os._exit``, which frees nothing (the report an ingest keeps for 100,000 steps is a million
structs, 0.1-0.3 s to free). Run in-process (tests), the next command's replaces it."""

from __future__ import annotations

_HELD: list[object] = []


def hold_until_exit(*done: object) -> None:
    """Leave ``done`` to the process's exit rather than free it now."""
    _HELD[:] = done
