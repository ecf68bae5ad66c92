"""The per-step figures rounded a column at once are the floats Python's ``round`` gives one at
a time (``units.exact_ms_column`` against ``units._exact_ms``), halves included."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceview.analysis.summary.units import _exact_ms, exact_ms_column


def test_a_column_rounds_as_round_does_one_value_at_a_time() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            rng.integers(0, 10**13, 50_000).astype(np.float64),  # whole ns
            rng.integers(0, 10**9, 50_000) / 2,  # means of two ranks: exact halves of a ns
            rng.integers(0, 10**9, 50_000) / 3,
            rng.integers(0, 10**7, 50_000) / 7,
            rng.random(50_000) * 1e12,
            # a half of the last place: 0.5 ns is 5e-7 ms, which rounds to even
            [0.5, 1.5, 2.5, 3.5, -0.5, -2.5, 0.0, 1e300, float("inf")],
        ]
    )
    got = exact_ms_column(pl.Series(values))
    want = [_exact_ms(float(v)) for v in values]
    assert got == want
    # the halves went both ways, as round-half-even on the exact value takes them
    assert got[-9:-5] == [round(v / 1e6, 6) for v in (0.5, 1.5, 2.5, 3.5)]


def test_whole_ns_in_an_integer_column() -> None:
    ns = pl.Series([0, 1, 999_999, 1_000_001, 123_456_789_012], dtype=pl.Int64)
    assert exact_ms_column(ns) == [0.0, 0.000001, 0.999999, 1.000001, 123456.789012]
