"""The path's time per step, rank, phase, kind and operator (``_blame_rows``), summed over
integer keys, against the same sums taken piece by piece in Python."""

from __future__ import annotations

from collections import Counter

import numpy as np
import polars as pl
import pytest

from traceview.analysis.critical_path.blame import _blame_rows
from traceview.analysis.critical_path.graph import NO_STEP
from traceview.analysis.critical_path.walk import PIECE_COLUMNS, Walks


def _walks(steps: list[int], pieces: list[tuple]) -> Walks:
    """Walks of ``steps``, each with the pieces given for it (step, rank, phase, op, kind, dur)."""
    pieces = sorted(pieces, key=lambda p: steps.index(p[0]))
    counts = [sum(1 for p in pieces if p[0] == s) for s in steps]
    frame = pl.DataFrame(
        [(r, ph, op, k, 1_000 * i, d) for i, (_, r, ph, op, k, d) in enumerate(pieces)],
        schema=PIECE_COLUMNS,
        orient="row",
    )
    zeros = np.zeros(len(steps), np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return Walks(np.array(steps, np.int64), zeros, zeros, [None] * len(steps), frame, offsets)


def _by_hand(pieces: list[tuple]) -> Counter:
    sums: Counter = Counter()
    for step, rank, phase, op, kind, dur in pieces:
        if dur > 0:
            sums[(step, rank, phase, kind, op)] += dur
    return sums


def _read(table: pl.DataFrame) -> Counter:
    assert table.schema["phase"] == pl.String and table.schema["op"] == pl.String
    return Counter({(s, r, p, k, o): ns for s, r, p, k, o, ns in table.iter_rows()})


@pytest.mark.parametrize("far_apart", [False, True])
def test_blame_rows_are_the_pieces_summed_by_their_labels(far_apart: bool) -> None:
    rng = np.random.default_rng(7)
    steps = [NO_STEP, 3, 1 << 61] if far_apart else [NO_STEP, 3, 4]  # (beyond one key: columns)
    labels = {
        "phase": ["forward", "backward", None],
        "op": ["aten::mm", None, "nccl"],
        "kind": ["compute", "transfer", "idle"],
    }
    pieces = [
        (
            steps[int(rng.integers(3))],
            int(rng.integers(0, 4)),
            labels["phase"][int(rng.integers(3))],
            labels["op"][int(rng.integers(3))],
            labels["kind"][int(rng.integers(3))],
            int(rng.integers(0, 3)) * int(rng.integers(1, 1_000_000)),  # (a third last nothing)
        )
        for _ in range(2_000)
    ]
    assert _read(_blame_rows(_walks(steps, pieces))) == _by_hand(pieces)


def test_a_label_null_on_every_piece_is_summed_as_null() -> None:
    pieces = [(2, 0, "forward", None, "compute", 5), (2, 0, "forward", None, "compute", 7)]
    assert _read(_blame_rows(_walks([2], pieces))) == Counter(
        {(2, 0, "forward", "compute", None): 12}
    )


def test_pieces_that_last_nothing_are_no_rows() -> None:
    pieces = [(2, 0, "forward", "aten::mm", "compute", 0)]
    assert _blame_rows(_walks([2], pieces)).height == 0


@pytest.mark.parametrize("shape", ["one step, one rank", "some steps with no piece", "nulls"])
def test_every_piece_lasting_is_summed_by_its_labels(shape: str) -> None:
    """Every piece lasting (one long step's path: nothing gathered, a key of one value
    skipped): the sums are the pieces', whichever keys vary."""
    rng = np.random.default_rng(11)
    steps = [5] if shape == "one step, one rank" else [1, 2, 7, 9]
    held = steps if shape != "some steps with no piece" else [2, 9]  # (1 and 7: none)
    ranks = [3] if shape == "one step, one rank" else [0, 1, 2]
    phases = ["forward", "backward", None] if shape == "nulls" else ["forward", "backward"]
    pieces = [
        (
            held[int(rng.integers(len(held)))],
            ranks[int(rng.integers(len(ranks)))],
            phases[int(rng.integers(len(phases)))],
            [None, "aten::mm", "aten::add"][int(rng.integers(3))] if shape == "nulls" else "mm",
            ["compute", "idle"][int(rng.integers(2))],
            int(rng.integers(1, 1_000_000)),
        )
        for _ in range(3_000)
    ]
    pieces.sort(key=lambda p: steps.index(p[0]))  # (a walk's pieces: by step)
    assert _read(_blame_rows(_walks(steps, pieces))) == _by_hand(pieces)
