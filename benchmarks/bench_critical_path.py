"""What the critical path across ranks costs: the graph, the walk and the replays of one step.

A synthetic data-parallel step of N ranks, each with S segments of its own work (1-100 µs,
drawn at random) split by C blocking all-reduces: every rank computes its share, issues the call,
and waits until the last rank has issued it plus a transfer; one rank starts late. Its segments
and matched calls are made as the per-rank analysis and ``match_collectives`` give them, then
timed: ``build_graph`` (waits cut at call ends, issue points), ``critical_paths`` (the walk),
one ``replay`` with no change, and ``explain`` alone (its own graph and walk, blame, per-step
paths and the report's what-ifs: what ``report`` adds for the critical path, ``report_s``). The replay must reproduce the step.

    .venv/bin/python benchmarks/bench_critical_path.py --ranks 16,256 --segments 10000 \\
        --calls 50 --json benchmarks/results/critical_path.json

Issue 33's target: a step of 256 ranks x 10,000 events under 5 s.

With ``--replicate N[,N...]`` it times what the critical path adds to the whole report instead:
the per-rank tables of ``sample_traces/pytorch/slowfwd`` (3 CPU ranks, gloo, 8 all-reduces per
step, 5 steps) replicated to N ranks, times shifted by up to a millisecond (as
``bench_crossrank.py`` does), summarized in one process without the segments table, with it,
and with it and the path a report before kept (runs/'s PathFile, in a scratch
folder): what ``report`` costs on a run directory after ``traceview ingest``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from traceview.analysis.critical_path import (  # noqa: E402
    build_graph,
    critical_paths,
    explain,
    replay,
)
from traceview.analysis.crossrank import Matched  # noqa: E402
from traceview.model import schema as S  # noqa: E402

US = 1_000


def synthetic_step(
    ranks: int, segments: int, calls: int, seed: int = 0
) -> tuple[pa.Table, Matched, int]:
    """One step's segments and matched calls; returns them and the step's true length (ns)."""
    rng = np.random.default_rng(seed)
    per_call = segments // calls
    work = rng.integers(1 * US, 100 * US, (ranks, calls, per_call))
    late = np.zeros(ranks, np.int64)
    late[ranks // 2] = 5_000 * US  # one rank starts 5 ms late
    transfer = rng.integers(50 * US, 500 * US, calls)
    t = late.copy()
    rank_col, start, end, kind, phase, op = [], [], [], [], [], []
    c_rank, c_issued, c_end, c_last, c_last_rank, c_pos = [], [], [], [], [], []
    for c in range(calls):
        bounds = t[:, None] + np.concatenate(
            [np.zeros((ranks, 1), np.int64), np.cumsum(work[:, c, :], axis=1)], axis=1
        )
        arrival = bounds[:, -1]
        last = int(arrival.max())
        done = last + int(transfer[c])
        rank_col.append(np.repeat(np.arange(ranks), per_call + 1))
        start.append(np.concatenate([bounds[:, :-1], arrival[:, None]], axis=1).ravel())
        end.append(np.concatenate([bounds[:, 1:], np.full((ranks, 1), done)], axis=1).ravel())
        k = np.array([S.SEGMENT_COMPUTE] * per_call + [S.SEGMENT_COMM], object)
        kind.append(np.tile(k, ranks))
        phase.append(np.tile(np.array([S.BACKWARD] * per_call + [S.COMM], object), ranks))
        op.append(np.tile(np.array(["mm"] * per_call + ["allreduce"], object), ranks))
        c_rank.append(np.arange(ranks))
        c_issued.append(arrival)
        c_end.append(np.full(ranks, done))
        c_last.append(np.full(ranks, last))
        c_last_rank.append(np.full(ranks, int(arrival.argmax())))
        c_pos.append(np.full(ranks, c))
        t = np.full(ranks, done)
    table = pa.table(
        {
            S.RANK: pa.array(np.concatenate(rank_col), pa.int32()),
            S.STEP: pa.array(np.ones(sum(len(x) for x in rank_col), np.int64)),
            S.START_NS: np.concatenate(start),
            S.END_NS: np.concatenate(end),
            S.PHASE: np.concatenate(phase).tolist(),
            S.KIND: np.concatenate(kind).tolist(),
            S.OP: np.concatenate(op).tolist(),
        },
        schema=S.SEGMENTS_SCHEMA,
    )
    order = np.lexsort((np.concatenate(start), np.concatenate(rank_col)))
    table = table.take(pa.array(order))
    n = ranks * calls
    issued = np.concatenate(c_issued)
    frame = pl.DataFrame(
        {
            S.RANK: pl.Series(np.concatenate(c_rank), dtype=pl.Int32),
            S.STEP: np.ones(n, np.int64),
            S.NAME: ["gloo:all_reduce"] * n,
            S.COLLECTIVE: ["allreduce"] * n,
            S.PID: np.ones(n, np.int64),
            S.TID: np.ones(n, np.int64),
            S.START_NS: issued,
            S.END_NS: np.concatenate(c_end),
            "issued": issued,
            "last_arrival_ns": np.concatenate(c_last),
            "last_rank": pl.Series(np.concatenate(c_last_rank), dtype=pl.Int32),
            "group_key": [""] * n,
            "step_key": np.ones(n, np.int64),
            "position": np.concatenate(c_pos),
            "participants": np.full(n, ranks),
            S.BYTES: np.full(n, 1 << 20),
        }
    )
    return table, Matched(frame), int(t.max())


def measure(ranks: int, segments: int, calls: int) -> dict[str, float | int]:
    table, matched, truth = synthetic_step(ranks, segments, calls)
    out: dict[str, float | int] = {"ranks": ranks, "segments_per_rank": segments, "calls": calls}
    t0 = time.perf_counter()
    graph = build_graph(table, matched, [1])
    t1 = time.perf_counter()
    assert graph is not None
    paths = critical_paths(graph)
    t2 = time.perf_counter()
    replayed = replay(graph)
    t3 = time.perf_counter()
    explain(table, matched, [1], [1], {p: 0.0 for p in S.BREAKDOWN_PHASES})
    t4 = time.perf_counter()
    assert replayed.step_ns[1] == truth, (replayed.step_ns, truth)
    assert sum(x.dur_ns for x in paths[0].pieces) == truth
    out.update(
        build_s=round(t1 - t0, 3),
        walk_s=round(t2 - t1, 3),
        replay_s=round(t3 - t2, 3),
        replay_passes=replayed.passes,
        # what report adds: explain builds and walks the graph itself, then replays the
        # report's what-ifs (about eight)
        report_s=round(t4 - t3, 3),
        path_pieces=len(paths[0].pieces),
    )
    return out


def added_to_report(ranks: int, repeat: int = 3) -> dict[str, float | int]:
    """``summarize`` of the slowfwd sample replicated to ``ranks`` ranks, with and without the
    critical path (the segments table)."""
    import statistics

    import bench_crossrank
    from bench_crossrank import manifest_for, replicate  # type: ignore[import-not-found]

    from traceview.analysis.summary import RunInputs, cross_rank_of, summarize
    from traceview.model.columns import TableOnDemand
    from traceview.runs import PathFile, open_run

    names = ("steps", "ops", "collectives", "comm", "segments")
    bench_crossrank.TIMED = names
    with open_run([REPO / "sample_traces" / "pytorch" / "slowfwd"]) as run:
        base = {name: run.tables[name] for name in names if name != "segments"}
        base["segments"] = run.segments.read()
    tables = replicate(base, ranks)
    manifest = manifest_for(ranks, 1)
    cross = cross_rank_of(manifest, tables["collectives"], tables["comm"])

    def once(segments: pa.Table | None, cache: PathFile | None = None) -> float:
        start = time.perf_counter()
        summarize(
            RunInputs(
                manifest, {n: tables[n] for n in ("steps", "ops", "collectives")}, cross=cross,
                segments=None if segments is None else TableOnDemand.of(segments),
                path_cache=cache,
            )
        )  # fmt: skip
        return time.perf_counter() - start

    without = statistics.median(once(None) for _ in range(repeat))
    with_path = statistics.median(once(tables["segments"]) for _ in range(repeat))
    with tempfile.TemporaryDirectory() as kept:  # the path kept by a report before (or ingest)
        cache = PathFile(Path(kept), b"bench")
        once(tables["segments"], cache)
        with_kept = statistics.median(once(tables["segments"], cache) for _ in range(repeat))
    return {
        "ranks": ranks,
        "segments": tables["segments"].num_rows,
        "summary_without_s": round(without, 3),
        "summary_with_s": round(with_path, 3),
        "summary_with_kept_path_s": round(with_kept, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicate", help="ranks to replicate the slowfwd sample to")
    parser.add_argument("--ranks", default="16,256")
    parser.add_argument("--segments", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.replicate:
        sys.path.insert(0, str(REPO / "benchmarks"))
        rows = [added_to_report(int(n)) for n in args.replicate.split(",")]
    else:
        rows = [measure(int(n), args.segments, args.calls) for n in args.ranks.split(",")]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(
            json.dumps({"machine": platform.platform(), "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
