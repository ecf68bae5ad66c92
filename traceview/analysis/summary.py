"""The run summary: per-rank and run-wide means, hidden communication, bottleneck, straggler.

The result is the JSON object of ``traceview report --json`` (its keys are a contract, see
DESIGN.md); the text report and the TUI render the same object.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from traceview import schema as S

HIDDEN_YES = 0.9  # at least this fraction of communication overlaps compute: "hidden: yes"
HIDDEN_NO = 0.1  # at most this: "hidden: no"
STRAGGLER_MIN_EXCESS = 0.05  # a straggler is busier than the median rank by at least 5%


def _ms(ns: float | int | None) -> float:
    return round(float(ns or 0) / 1e6, 3)


def hidden_verdict(comm_total_ns: float, hidden_fraction: float) -> str:
    if comm_total_ns <= 0:
        return "n/a"
    if hidden_fraction >= HIDDEN_YES:
        return "yes"
    if hidden_fraction <= HIDDEN_NO:
        return "no"
    return "partly"


def bottleneck_of(breakdown_ms: dict[str, float]) -> str | None:
    shares = {p: breakdown_ms.get(p, 0.0) for p in S.BOTTLENECK_PHASES}
    best = max(shares, key=lambda p: shares[p])
    return best if shares[best] > 0 else None


def _rank_rows(steps: pl.DataFrame) -> pl.DataFrame:
    phase_cols = [S.phase_ns(p) for p in S.BREAKDOWN_PHASES]
    return (
        steps.group_by(S.RANK)
        .agg(
            pl.len().alias("steps"),
            pl.col(S.WALL_NS).mean(),
            *(pl.col(c).mean() for c in phase_cols),
            pl.col(S.COMM_TOTAL_NS).mean(),
            pl.col(S.COMM_EXPOSED_NS).mean(),
            pl.col(S.COMM_TOTAL_NS).sum().alias("comm_total_sum"),
            pl.col(S.COMM_EXPOSED_NS).sum().alias("comm_exposed_sum"),
            pl.col(S.TIMELINE).first(),
        )
        .with_columns(
            (pl.col(S.WALL_NS) - pl.col(S.COMM_EXPOSED_NS) - pl.col(S.phase_ns(S.IDLE))).alias(
                "busy_ns"
            )
        )
        .sort(S.RANK)
    )


def _hidden(total: float, exposed: float) -> float:
    return round(1.0 - exposed / total, 4) if total > 0 else 0.0


def summarize(
    steps: pa.Table, ops: pa.Table, manifest: dict[str, Any], top: int = 10
) -> dict[str, Any]:
    """The report object for a run (see DESIGN.md, ``report --json``)."""
    df = pl.from_arrow(steps)
    assert isinstance(df, pl.DataFrame)
    ranks_df = _rank_rows(df) if df.height else pl.DataFrame()
    ranks: list[dict[str, Any]] = []
    for row in ranks_df.iter_rows(named=True):
        breakdown = {p: _ms(row[S.phase_ns(p)]) for p in S.BREAKDOWN_PHASES}
        ranks.append(
            {
                "rank": row[S.RANK],
                "steps": row["steps"],
                "step_ms": _ms(row[S.WALL_NS]),
                "breakdown_ms": breakdown,
                "comm_total_ms": _ms(row[S.COMM_TOTAL_NS]),
                "comm_exposed_ms": _ms(row[S.COMM_EXPOSED_NS]),
                "comm_hidden_fraction": _hidden(row["comm_total_sum"], row["comm_exposed_sum"]),
                "busy_ms": _ms(row["busy_ns"]),
                "bottleneck": bottleneck_of(breakdown),
                "timeline": row[S.TIMELINE],
            }
        )

    summary: dict[str, Any] = {
        "breakdown_ms": {p: 0.0 for p in S.BREAKDOWN_PHASES},
        "step_ms": 0.0,
        "comm_total_ms": 0.0,
        "comm_exposed_ms": 0.0,
        "comm_hidden_fraction": 0.0,
        "hidden": "n/a",
        "bottleneck": None,
        "bottleneck_share": 0.0,
        "straggler_rank": None,
        "straggler_excess": 0.0,
    }
    if ranks:
        n = len(ranks)
        breakdown = {
            p: round(sum(r["breakdown_ms"][p] for r in ranks) / n, 3) for p in S.BREAKDOWN_PHASES
        }
        step_ms = round(sum(r["step_ms"] for r in ranks) / n, 3)
        total = float(ranks_df["comm_total_sum"].sum())
        exposed = float(ranks_df["comm_exposed_sum"].sum())
        hidden = _hidden(total, exposed)
        bottleneck = bottleneck_of(breakdown)
        summary.update(
            breakdown_ms=breakdown,
            step_ms=step_ms,
            comm_total_ms=round(sum(r["comm_total_ms"] for r in ranks) / n, 3),
            comm_exposed_ms=round(sum(r["comm_exposed_ms"] for r in ranks) / n, 3),
            comm_hidden_fraction=hidden,
            hidden=hidden_verdict(total, hidden),
            bottleneck=bottleneck,
            bottleneck_share=round(breakdown[bottleneck] / step_ms, 4)
            if bottleneck and step_ms
            else 0.0,
        )
        if n > 1:
            busy = sorted(r["busy_ms"] for r in ranks)
            median = busy[n // 2] if n % 2 else (busy[n // 2 - 1] + busy[n // 2]) / 2
            slowest = max(ranks, key=lambda r: r["busy_ms"])
            excess = (slowest["busy_ms"] - median) / median if median > 0 else 0.0
            summary["straggler_rank"] = slowest["rank"]
            summary["straggler_excess"] = round(excess, 4)
            summary["straggler_significant"] = excess >= STRAGGLER_MIN_EXCESS

    ops_df = pl.from_arrow(ops)
    assert isinstance(ops_df, pl.DataFrame)
    top_ops: list[dict[str, Any]] = []
    if ops_df.height:
        n_steps = max(int(df.height), 1)
        # Operators and device activities; regions (annotations) hold waits, not work.
        operators = ops_df.filter(pl.col(S.KIND).is_in([S.KIND_OP, *S.DEVICE_ACTIVITY_KINDS]))
        agg = (
            operators.group_by(S.DEVICE, S.PHASE, S.OP)
            .agg(
                pl.col(S.NAME).first(),
                pl.col(S.COUNT).sum(),
                pl.col(S.TOTAL_NS).sum(),
                pl.col(S.SELF_NS).sum(),
                pl.col(S.P95_NS).max(),
            )
            .sort(S.SELF_NS, descending=True)
            .head(top)
        )
        for row in agg.iter_rows(named=True):
            top_ops.append(
                {
                    "op": row[S.OP],
                    "name": row[S.NAME],
                    "device": row[S.DEVICE],
                    "phase": row[S.PHASE],
                    "calls_per_step": round(row[S.COUNT] / n_steps, 2),
                    "self_ms_per_step": _ms(row[S.SELF_NS] / n_steps),
                    "total_ms_per_step": _ms(row[S.TOTAL_NS] / n_steps),
                    "p95_ms": _ms(row[S.P95_NS]),
                }
            )

    world = manifest.get("world_size")
    collected = manifest.get("collect") or {}
    job = None
    if collected:
        clocks = [r.get("clock") or {} for r in collected.get("ranks", [])]
        probed = [c for c in clocks if c.get("method") == "tcp"]
        job = {
            "command": collected.get("command"),
            "exit_code": collected.get("exit_code"),
            "hosts": collected.get("hosts", []),
            "clock_method": "tcp"
            if probed and len(probed) == len(clocks)
            else ("mixed" if probed else "wallclock"),
            "clock_uncertainty_us": round(
                max((c.get("uncertainty_ns") or 0) for c in probed) / 1e3, 1
            )
            if probed
            else None,
            "max_clock_offset_us": round(max(abs(c.get("offset_ns") or 0) for c in probed) / 1e3, 1)
            if probed
            else None,
        }
    return {
        "run": {
            "framework": manifest.get("framework"),
            "ranks": len(ranks),
            "steps": int(df[S.STEP].n_unique())
            if df.height and df[S.STEP].null_count() == 0
            else 0,
            "world_size": world,
            "missing_ranks": manifest.get("missing_ranks", []),
            "timeline": ranks[0]["timeline"] if ranks else None,
            "path": manifest.get("path"),
            "run_id": manifest.get("run_id"),
            "job": job,
        },
        "summary": summary,
        "ranks": ranks,
        "top_ops": top_ops,
        "warnings": manifest.get("notes", {}).get("warnings", []),
        "remarks": manifest.get("notes", {}).get("remarks", []),
    }
