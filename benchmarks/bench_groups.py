"""What process groups add to a report: a 1,024-rank job on a three-dimensional mesh.

A synthetic job of ``dp x tp x pp`` ranks (16 x 8 x 8 = 1,024; rank = pp*dp*tp + dp_i*tp + tp_i,
tensor parallelism innermost, as DeviceMesh lays out ``("pp", "dp", "tp")``) makes per step,
as an NCCL trace records them on its streams: four tensor-parallel all-reduces in forward and
four in backward (group ``mesh_tp``), a send to the next stage and a receive from the previous
one in forward and the reverse in backward (``mesh_pp``; peers as the trace gives them, inside
the group), two reduce-scatters in backward and an all-gather in the update (``mesh_dp``).
Arrivals are jittered per rank and call; a synchronizing call ends on every member a transfer
after its group's last arrival, a point-to-point pair a transfer after the later of the two.

Each rank declares its groups in the manifest as the Kineto parser records them from
``distributedInfo.pg_config`` (``{name, desc, ranks}``, ranks encoded): by default the groups it
is a member of plus the world (``--declare own``), or every group of the mesh on every rank
(``--declare all``: what a job that creates every subgroup on every rank writes).

The report (read steps, ops, collectives and comm from Parquet, the cross-rank pass,
``summarize``) is timed in process twice: on the job with its groups (calls name their group,
ranks declare them), and on the same job without (no group on any call, none declared, peers
as ranks of the world: every call matched across the world, as before issue 32). What the
command line adds to both (the interpreter, imports, the manifest) is left out, so the share is
an upper bound.

    .venv/bin/python benchmarks/bench_groups.py --repeat 5 \\
        --json benchmarks/results/groups.json --markdown benchmarks/results/groups.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from traceview.analysis.summary import RunInputs, cross_rank_of, summarize  # noqa: E402
from traceview.model import schema as S  # noqa: E402
from traceview.model.columns import encode_ranks  # noqa: E402
from traceview.model.manifest import Manifest, RankIngest  # noqa: E402
from traceview.store import rundir as R  # noqa: E402

TABLES = ("steps", "ops", "collectives", "comm")
US = 1_000  # ns
STEP_NS = 40_000 * US
TRANSFER_NS = 300 * US
JITTER_NS = 200 * US
KERNELS = {
    "allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
    "allgather": "ncclDevKernel_AllGather_RING_LL",
    "send": "ncclDevKernel_SendRecv",
    "recv": "ncclDevKernel_SendRecv",
}


class Mesh:
    """The ranks' coordinates and each dimension's groups (names as NCCL numbers them)."""

    def __init__(self, dp: int, tp: int, pp: int) -> None:
        self.shape = {"pp": pp, "dp": dp, "tp": tp}
        self.world = dp * tp * pp
        r = np.arange(self.world)
        self.coord = {"tp": r % tp, "dp": (r // tp) % dp, "pp": r // (tp * dp)}
        # each rank's group of a dimension: the ranks that share its other coordinates
        self.group_id = {
            "tp": r // tp,
            "dp": self.coord["pp"] * tp + self.coord["tp"],
            "pp": r % (tp * dp),
        }
        self.names: dict[str, list[str]] = {}
        self.members: dict[str, list[list[int]]] = {}
        first = 1  # "0" is the world
        for dim in ("pp", "dp", "tp"):
            ids = self.group_id[dim]
            n = int(ids.max()) + 1
            self.names[dim] = [str(first + i) for i in range(n)]
            order = np.argsort(ids, kind="stable")
            self.members[dim] = [m.tolist() for m in np.split(r[order], n)]
            first += n

    def declared(self, rank: int, every: bool) -> list[dict[str, str]]:
        """The rank's ``pg_config`` entries as the parser records them."""
        out = [{"name": "0", "desc": "default_pg", "ranks": encode_ranks(list(range(self.world)))}]
        for dim in ("pp", "dp", "tp"):
            mine = int(self.group_id[dim][rank])
            for i, members in enumerate(self.members[dim]):
                if every or i == mine:
                    out.append(
                        {
                            "name": self.names[dim][i],
                            "desc": f"mesh_{dim}",
                            "ranks": encode_ranks(members),
                        }
                    )
        return out


def make_tables(mesh: Mesh, steps: int, grouped: bool, seed: int = 0) -> dict[str, pa.Table]:
    """The job's per-rank tables (module docstring): with the calls' groups and in-group peers
    (``grouped``), or with neither."""
    rng = np.random.default_rng(seed)
    n = mesh.world
    ranks = np.arange(n, dtype=np.int32)
    stage, stages = mesh.coord["pp"], mesh.shape["pp"]
    # (offset in the step in µs, dimension, collective, phase, bytes, direction for p2p)
    plan: list[tuple[int, str, str, str, int, int]] = []
    plan += [(1_000 + 3_000 * i, "tp", "allreduce", "forward", 8 << 20, 0) for i in range(4)]
    plan += [(13_000, "pp", "send", "forward", 4 << 20, +1), (13_000, "pp", "recv", "forward", 4 << 20, -1)]  # fmt: skip
    plan += [(16_000 + 3_000 * i, "tp", "allreduce", "backward", 8 << 20, 0) for i in range(4)]
    plan += [(28_000, "dp", "reduce_scatter", "backward", 64 << 20, 0)]
    plan += [(30_000, "pp", "send", "backward", 4 << 20, -1), (30_000, "pp", "recv", "backward", 4 << 20, +1)]  # fmt: skip
    plan += [(32_000, "dp", "reduce_scatter", "backward", 64 << 20, 0)]
    plan += [(36_000, "dp", "allgather", "update", 64 << 20, 0)]
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "step", "name", "op", "group", "bytes", "start", "end", "issued", "peer", "phase", "exposed")}  # fmt: skip
    for step in range(steps):
        base = 1_700_000_000_000_000_000 + step * STEP_NS
        drawn: dict[int, np.ndarray] = {}
        for offset, dim, op, phase, size, direction in plan:
            # a send and its receive share their draw: each side's arrival is its rank's
            if not direction or offset not in drawn:
                drawn[offset] = base + offset * US + rng.integers(0, JITTER_NS, n)
            start = drawn[offset]
            if direction:
                # sends go to stage + direction, receives come from stage + direction
                keep = (stage + direction >= 0) & (stage + direction < stages)
                partner = ranks + direction * mesh.shape["tp"] * mesh.shape["dp"]
                # a pair ends a transfer after its later side arrives
                other = np.where(keep, start[np.clip(partner, 0, n - 1)], start)
                end = np.maximum(start, other) + TRANSFER_NS
                peer = (stage + direction) if grouped else partner
                sel = keep
            else:
                ids = mesh.group_id[dim]
                last = np.zeros(int(ids.max()) + 1, np.int64)
                np.maximum.at(last, ids, start)
                end = last[ids] + TRANSFER_NS + rng.integers(0, 20 * US, n)
                peer = np.full(n, -1)
                sel = np.ones(n, bool)
            m = int(sel.sum())
            groups = np.array(mesh.names[dim], dtype=object)[mesh.group_id[dim]]
            cols["rank"].append(ranks[sel])
            cols["step"].append(np.full(m, step))
            cols["name"].append(np.full(m, KERNELS[op], dtype=object))
            cols["op"].append(np.full(m, op, dtype=object))
            cols["group"].append(groups[sel] if grouped else np.full(m, None, dtype=object))
            cols["bytes"].append(np.full(m, size))
            cols["start"].append(start[sel])
            cols["end"].append(end[sel])
            cols["issued"].append(start[sel] - 50 * US)
            cols["peer"].append(peer[sel])
            cols["phase"].append(np.full(m, phase, dtype=object))
            cols["exposed"].append(np.full(m, phase != "backward"))
    c = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.lexsort((c["start"], c["rank"]))
    c = {k: v[order] for k, v in c.items()}
    # a call's order among its rank's calls of its (name, collective)
    key = np.char.add(c["name"].astype(str), c["op"].astype(str))
    seq_col = np.zeros(len(order), np.int64)
    for view in np.unique(key):
        idx = np.flatnonzero(key == view)
        ranks_of = c["rank"][idx]
        first = np.searchsorted(ranks_of, ranks_of, side="left")
        seq_col[idx] = np.arange(len(idx)) - first
    collectives = S.conform(
        pa.table(
            {
                S.RANK: pa.array(c["rank"], pa.int32()),
                S.STEP: pa.array(c["step"], pa.int64()),
                S.DEVICE: pa.array(np.full(len(order), "gpu", dtype=object), pa.string()),
                S.PID: pa.array(c["rank"].astype(np.int64)),
                S.TID: pa.array(np.full(len(order), 7, np.int64)),
                S.NAME: pa.array(c["name"], pa.string()),
                S.COLLECTIVE: pa.array(c["op"], pa.string()),
                S.GROUP: pa.array(c["group"], pa.string()),
                S.SEQ: pa.array(seq_col),
                S.BYTES: pa.array(c["bytes"], pa.int64()),
                S.START_NS: pa.array(c["start"], pa.int64()),
                S.END_NS: pa.array(c["end"], pa.int64()),
                S.ISSUED_NS: pa.array(c["issued"], pa.int64()),
                S.PEER: pa.array(np.where(c["peer"] < 0, None, c["peer"]).tolist(), pa.int32()),
                S.ISSUED_IN: pa.array(c["phase"], pa.string()),
            }
        ),
        S.COLLECTIVES_SCHEMA,
    )
    comm = S.conform(
        pa.table(
            {
                S.RANK: pa.array(c["rank"], pa.int32()),
                S.STEP: pa.array(c["step"], pa.int64()),
                S.START_NS: pa.array(c["issued"], pa.int64()),
                S.END_NS: pa.array(c["end"], pa.int64()),
                S.EXPOSED: pa.array(c["exposed"], pa.bool_()),
            }
        ),
        S.COMM_SCHEMA,
    )
    return {
        "collectives": collectives,
        "comm": comm,
        "steps": _steps(n, steps),
        "ops": _ops(n),
    }


def _steps(n: int, steps: int) -> pa.Table:
    rank = np.repeat(np.arange(n, dtype=np.int32), steps)
    step = np.tile(np.arange(steps), n)
    ms = 1_000 * US
    phases = {
        S.IO: 1 * ms, S.H2D: 0, S.FORWARD: 14 * ms, S.BACKWARD: 16 * ms, S.UPDATE: 3 * ms,
        S.COMM: 5 * ms, S.OTHER: 1 * ms, S.IDLE: 0,
    }  # fmt: skip
    start = 1_700_000_000_000_000_000 + step * STEP_NS
    data: dict[str, object] = {
        S.RANK: rank,
        S.STEP: step,
        S.TIMELINE: np.full(len(rank), "gpu", dtype=object),
        S.START_NS: start,
        S.END_NS: start + STEP_NS,
        S.WALL_NS: np.full(len(rank), sum(phases.values())),
        **{S.phase_ns(p): np.full(len(rank), v) for p, v in phases.items()},
        S.COMM_TOTAL_NS: np.full(len(rank), 12 * ms),
        S.COMM_EXPOSED_NS: np.full(len(rank), 5 * ms),
        S.COMM_HIDDEN_FRACTION: np.full(len(rank), 7 / 12),
        **{S.host_bound_ns(p): np.zeros(len(rank), np.int64) for p in S.GPU_HOST_BOUND_PHASES},
    }
    return S.conform(pa.table(data), S.STEPS_SCHEMA)


def _ops(n: int) -> pa.Table:
    names = ["aten::mm", "aten::addmm", "aten::add_"]
    rank = np.repeat(np.arange(n, dtype=np.int32), len(names))
    k = len(rank)
    return S.conform(
        pa.table(
            {
                S.RANK: rank,
                S.DEVICE: np.full(k, "gpu", dtype=object),
                S.KIND: np.full(k, "kernel", dtype=object),
                S.PHASE: np.tile(np.array(["forward", "backward", "update"], dtype=object), n),
                S.OP: np.tile(np.array(["matmul", "matmul", "add"], dtype=object), n),
                S.NAME: np.tile(np.array(names, dtype=object), n),
                S.COUNT: np.full(k, 10),
                S.TOTAL_NS: np.full(k, 10_000_000),
                S.SELF_NS: np.full(k, 10_000_000),
                S.MEAN_NS: np.full(k, 1e6),
                S.P50_NS: np.full(k, 1e6),
                S.P95_NS: np.full(k, 1e6),
            }
        ),
        S.OPS_SCHEMA,
    )


def manifest_for(mesh: Mesh, grouped: bool, every: bool) -> Manifest:
    return Manifest(
        framework="pytorch",
        world_size=mesh.world,
        ranks=[
            RankIngest(
                rank=r,
                host=f"node{r // 8}",
                events=1,
                meta={"process_groups": mesh.declared(r, every)} if grouped else {},
            )
            for r in range(mesh.world)
        ],
    )


def timed(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Wall and CPU seconds (all the process's threads: polars runs several) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mesh", default="16x8x8", help="dp x tp x pp")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--declare", default="own,all", help="own, all or both (comma)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    dp, tp, pp = (int(x) for x in args.mesh.split("x"))
    mesh = Mesh(dp, tp, pp)
    folder = Path(tempfile.mkdtemp(prefix="bench-groups-"))
    paths = {}
    for grouped in (False, True):
        tables = make_tables(mesh, args.steps, grouped)
        paths[grouped] = folder / ("grouped" if grouped else "plain")
        paths[grouped].mkdir()
        for name, table in tables.items():
            R.write_parquet(paths[grouped] / f"{name}.parquet", table)
    calls = tables["collectives"].num_rows

    def report(where: Path, manifest: Manifest):  # type: ignore[no-untyped-def]
        steps, ops, collectives, comm = (R.read_table(where / f"{t}.parquet") for t in TABLES)
        cross = cross_rank_of(manifest, collectives, comm)
        tables = {"steps": steps, "ops": ops, "collectives": collectives, "comm": comm}
        return summarize(RunInputs(manifest, tables, cross=cross))

    rows = []
    plain_manifest = manifest_for(mesh, False, False)
    for declare in args.declare.split(","):
        manifest = manifest_for(mesh, True, declare == "all")
        without: list[tuple[float, float]] = []
        with_groups: list[tuple[float, float]] = []
        for _ in range(args.repeat):  # interleaved, so load on the machine hits both alike
            without.append(timed(lambda: report(paths[False], plain_manifest)))
            with_groups.append(timed(lambda m=manifest: report(paths[True], m)))
        wall = [statistics.median(t[0] for t in runs) for runs in (without, with_groups)]
        cpu = [statistics.median(t[1] for t in runs) for runs in (without, with_groups)]
        # the fastest run of each: the least disturbed by the other work on a shared machine
        best = [min(t[1] for t in runs) for runs in (without, with_groups)]
        result = report(paths[True], manifest)
        declared = sum(len(r.meta["process_groups"]) for r in manifest.ranks)
        row = {
            "ranks": mesh.world,
            "mesh": f"dp {dp} x tp {tp} x pp {pp}",
            "declared": declare,
            "declared_entries": declared,
            "collective_calls": calls,
            "without_s": wall[0],
            "with_s": wall[1],
            "added": wall[1] / wall[0] - 1,
            "without_cpu_s": cpu[0],
            "with_cpu_s": cpu[1],
            "added_cpu": cpu[1] / cpu[0] - 1,
            "added_cpu_best": best[1] / best[0] - 1,
            "runs": {"without": without, "with": with_groups},
            "groups": len(result.groups),
            "matched_rows": len(result.collectives),
            "pipeline_stages": len(result.pipeline.stages) if result.pipeline else None,
            "warnings": result.warnings,
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    lines = [
        "| ranks | mesh | groups declared per rank | calls | report without groups "
        "(wall / CPU) | with groups | added (wall / CPU; CPU of the fastest runs) |",
        "|---:|---|---|---:|---:|---:|---:|",
        *(
            f"| {r['ranks']:,} | {r['mesh']} | {r['declared']} ({r['declared_entries']:,} entries) "
            f"| {r['collective_calls']:,} | {r['without_s']:.3f} s / {r['without_cpu_s']:.3f} s "
            f"| {r['with_s']:.3f} s / {r['with_cpu_s']:.3f} s "
            f"| {r['added']:+.0%} / {r['added_cpu']:+.0%}; {r['added_cpu_best']:+.0%} |"
            for r in rows
        ),
    ]
    print("\n".join(lines))
    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
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
