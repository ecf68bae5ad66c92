"""Small conversions the report's figures share: ns to ms, rounding, means, splits, host-bound
parts."""

from __future__ import annotations

import statistics

import polars as pl

from traceview.analysis.rounding import rounded
from traceview.model import schema as S
from traceview.model.results import HostBound


def _ms(ns: float | int | None) -> float:
    return round(float(ns or 0) / 1e6, 3)


def _hidden(total: float, exposed: float) -> float:
    return round(1.0 - exposed / total, 4) if total > 0 else 0.0


def _exact_ms(ns: float) -> float:
    """ns as ms to the ns (6 decimals): figures views round again are not rounded twice."""
    return round(float(ns) / 1e6, 6)


def ms_column(ns: pl.Series) -> list[float]:
    """``_ms`` of every value of ``ns`` (null: 0), the same floats, computed at once."""
    return rounded(ns.fill_null(0).cast(pl.Float64).to_numpy() / 1e6, 3)


def exact_ms_column(ns: pl.Series) -> list[float]:
    """``_exact_ms`` of every value of ``ns`` (not null), the same floats, computed at once."""
    return rounded(ns.cast(pl.Float64).to_numpy() / 1e6, 6)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _split(part_ns: float | None, whole_ms: float) -> tuple[float | None, float | None]:
    """(part, whole - part) in ms; (None, None) where the part is not known."""
    if part_ns is None:
        return None, None
    part = min(_ms(part_ns), whole_ms)
    return part, round(whole_ms - part, 3)


def _mean_host_bound(values: list[HostBound | None]) -> HostBound | None:
    """The mean over ranks of their host-bound parts (a CPU rank's phases have none: 0); null
    where no rank has any."""
    if all(v is None for v in values):
        return None
    return HostBound(
        **{
            p: round(sum(v[p] for v in values if v is not None) / len(values), 3)
            for p in S.GPU_HOST_BOUND_PHASES
        }
    )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(values), 3) if known and len(known) == len(values) else None


def _round(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if value is not None else None
