"""What matching collectives across ranks adds to a report, at 2 to 1,024 ranks.

The per-rank tables of a real run (``sample_traces/pytorch/slowfwd``: 3 CPU ranks, gloo, 8
all-reduces per step, rank 1 a straggler) are replicated to N ranks, each copy a rank of its
own with its times shifted by up to a millisecond (so arrivals differ as in a real job), and
the report is computed from them twice in one process: without the cross-rank pass (what
``summarize`` did before it: read steps.parquet and ops.parquet, summarize) and with it (read
collectives.parquet and comm.parquet too; match, split the waits, find who caused them, and for
traces from several hosts estimate the clocks). What ``traceview report RUN`` adds to both
(the interpreter, imports, the manifest) is left out, so the share is an upper bound.

    .venv/bin/python benchmarks/bench_crossrank.py --ranks 2,128,256,1024 --repeat 5 \\
        --json benchmarks/results/crossrank.json --markdown benchmarks/results/crossrank.md

With ``--run RUN`` (a run directory ``traceview ingest`` made, e.g. of the N-rank sets
``make_big_trace.py --ranks N`` makes) it times what a user waits for instead:
``traceview report RUN --json`` end to end in a fresh process, and within it the cross-rank
pass alone, in process, on the run's cached tables.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from traceview.analysis.summary import RunInputs, cross_rank_of, summarize  # noqa: E402
from traceview.model import schema as S  # noqa: E402
from traceview.model.manifest import Manifest, RankIngest  # noqa: E402
from traceview.runs import open_run  # noqa: E402
from traceview.store import rundir as R  # noqa: E402

SAMPLE = REPO / "sample_traces" / "pytorch" / "slowfwd"
TIMED = ("steps", "ops", "collectives", "comm")


def replicate(tables: dict[str, pa.Table], ranks: int, seed: int = 0) -> dict[str, pa.Table]:
    """``ranks`` ranks made of the sample's, rank r a copy of sample rank r % n, its times
    shifted by a random 0-1 ms."""
    rng = np.random.default_rng(seed)
    sample_ranks = sorted(set(pc.unique(tables["steps"].column(S.RANK)).to_pylist()))
    shifts = rng.integers(0, 1_000_000, ranks)
    out: dict[str, list[pa.Table]] = {name: [] for name in TIMED}
    for r in range(ranks):
        source = sample_ranks[r % len(sample_ranks)]
        for name in TIMED:
            table = tables[name]
            part = table.filter(pc.equal(table.column(S.RANK), source))
            part = part.set_column(
                part.schema.get_field_index(S.RANK),
                S.RANK,
                pa.array(np.full(part.num_rows, r, np.int32)),
            )
            for column in (S.START_NS, S.END_NS):
                if column in part.column_names:
                    i = part.schema.get_field_index(column)
                    shifted = pc.add(part.column(column), pa.scalar(int(shifts[r]), pa.int64()))
                    part = part.set_column(i, column, shifted)
            out[name].append(part)
    return {name: pa.concat_tables(parts) for name, parts in out.items()}


def manifest_for(ranks: int, hosts: int) -> Manifest:
    return Manifest(
        framework="pytorch",
        world_size=ranks,
        ranks=[RankIngest(rank=r, host=f"node{r % hosts}", events=1) for r in range(ranks)],
    )


def best_of(repeat: int, fn) -> list[float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def time_run(run_dir: Path, repeat: int) -> dict[str, object]:
    """``traceview report RUN --json`` end to end, and the cross-rank pass within it."""
    import subprocess

    command = [sys.executable, "-m", "traceview", "report", str(run_dir), "--json"]
    subprocess.run(command, check=True, capture_output=True)  # the analysis cache, written once
    report_s = best_of(repeat, lambda: subprocess.run(command, check=True, capture_output=True))
    with open_run([run_dir]) as run:
        manifest, tables = run.manifest, run.tables
        cross_s = best_of(
            repeat, lambda: cross_rank_of(manifest, tables["collectives"], tables["comm"])
        )
        ranks = run.report().run.ranks
        calls = tables["collectives"].num_rows
    row = {
        "run": str(run_dir),
        "ranks": ranks,
        "collective_calls": calls,
        "report_s": statistics.median(report_s),
        "cross_rank_s": statistics.median(cross_s),
    }
    row["share"] = float(row["cross_rank_s"]) / float(row["report_s"])  # type: ignore[arg-type]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,128,256,1024")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--run", type=Path, action="append", help="time `report` on a run dir")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    if args.run:
        rows = [time_run(run_dir, args.repeat) for run_dir in args.run]
        lines = [
            "| run | ranks | collective calls | `report --json` | cross-rank pass | share |",
            "|---|---:|---:|---:|---:|---:|",
            *(
                f"| {Path(str(r['run'])).name} | {r['ranks']:,} | {r['collective_calls']:,} | "
                f"{r['report_s']:.2f} s | {r['cross_rank_s']:.3f} s | {r['share']:.0%} |"
                for r in rows
            ),
        ]
        print("\n".join(lines))
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        if args.markdown:
            args.markdown.write_text("\n".join(lines) + "\n")
        return 0

    with open_run([SAMPLE]) as run:
        base = {name: run.tables[name] for name in TIMED}
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="bench-crossrank-"))
    for n in [int(x) for x in args.ranks.split(",")]:
        tables = replicate(base, n)
        for name, table in tables.items():
            R.write_parquet(folder / f"{name}.parquet", table)

        def read(*names: str) -> list[pa.Table]:
            return [R.read_table(folder / f"{name}.parquet") for name in names]

        calls = tables["collectives"].num_rows
        for hosts, label in ((1, "one host"), (n, "a host per rank: clocks estimated")):
            manifest = manifest_for(n, hosts)

            def plain(manifest: Manifest = manifest) -> None:
                steps, ops = read("steps", "ops")
                summarize(RunInputs(manifest, {"steps": steps, "ops": ops}))

            def crossed(manifest: Manifest = manifest) -> None:
                steps, ops, collectives, comm = read(*TIMED)
                cross = cross_rank_of(manifest, collectives, comm)
                tables = {"steps": steps, "ops": ops, "collectives": collectives}
                summarize(RunInputs(manifest, tables, cross=cross))

            without = best_of(args.repeat, plain)
            with_cross = best_of(args.repeat, crossed)
            report = summarize(
                RunInputs(
                    manifest, {n: tables[n] for n in ("steps", "ops", "collectives")},
                    cross=cross_rank_of(manifest, tables["collectives"], tables["comm"]),
                )
            )  # fmt: skip
            rows.append(
                {
                    "ranks": n,
                    "collective_calls": calls,
                    "clocks": label,
                    "without_s": statistics.median(without),
                    "with_s": statistics.median(with_cross),
                    "added": statistics.median(with_cross) / statistics.median(without) - 1,
                    "matched": len(report.collectives),
                    "straggler_rank": report.summary.straggler_rank,
                }
            )
            print(json.dumps(rows[-1]), flush=True)

    lines = [
        "| ranks | collective calls | clocks | report without | with cross-rank | added |",
        "|---:|---:|---|---:|---:|---:|",
        *(
            f"| {r['ranks']:,} | {r['collective_calls']:,} | {r['clocks']} | "
            f"{r['without_s']:.3f} s | {r['with_s']:.3f} s | {r['added']:+.0%} |"
            for r in rows
        ),
    ]
    print("\n".join(lines))
    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": __import__("os").cpu_count(),
        "repeat": args.repeat,
        "command": " ".join(sys.argv),
    }
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
