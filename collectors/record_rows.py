"""The rows of the step record (collectors/rankside_record.py) as numpy sees them: what reading a
record needs and nothing more (numpy only: `traceview watch` starts without pyarrow;
parsers/record.py reads the rest). Every byte is untrusted (parsers/record.py's rules)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traceview.collectors import rankside_record as R

STEP_DTYPE = np.dtype(
    [("step", "<u4"), ("calls", "<u4"), ("start_ns", "<i8"), ("end_ns", "<i8"),
     ("io_ns", "<i8"), ("comm_ns", "<i8")]
)  # fmt: skip
CALL_DTYPE = np.dtype(
    [("start_ns", "<i8"), ("end_ns", "<i8"), ("bytes", "<i8"), ("seq", "<u4"), ("step", "<u4"),
     ("group", "<u2"), ("op", "u1"), ("flags", "u1"), ("peer", "<i4")]
)  # fmt: skip
assert STEP_DTYPE.itemsize == R.STEP_ROW.size and CALL_DTYPE.itemsize == R.CALL_ROW.size


def written_rows(body: bytes) -> np.ndarray:
    """The step rows of steps.bin's body (after its magic) that were written: its whole rows up
    to the first that is not (the file grows in zeroed chunks; a row being written, seen from
    another process, is not whole yet)."""
    whole = len(body) // STEP_DTYPE.itemsize
    rows = np.frombuffer(body[: whole * STEP_DTYPE.itemsize], STEP_DTYPE)
    unwritten = np.flatnonzero(rows["start_ns"] == 0)
    return rows[: unwritten[0]] if len(unwritten) else rows


def has_steps(path: Path) -> bool:
    """Whether a rank's steps.bin holds a step (its first row written)."""
    try:
        with R.open_regular(path) as f:
            head = f.read(len(R.MAGIC_STEPS) + STEP_DTYPE.itemsize)
    except OSError:
        return False
    return len(written_rows(head[len(R.MAGIC_STEPS) :])) > 0 and head.startswith(R.MAGIC_STEPS)


def op_name(index: int) -> str:
    return R.OPS[index] if 0 <= index < len(R.OPS) else "other"
