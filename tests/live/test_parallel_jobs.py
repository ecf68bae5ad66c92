"""Issue 32's ground truth: real parallel jobs beyond data parallelism, held to their own timers.

The jobs (tests/workloads/parallel/, CPU, gloo, torchrun) build their process groups and time
their phases, pipeline stages and collective calls on every rank with time.perf_counter_ns; each
writes truth/rank<R>.json next to its run directory (format: tests/workloads/parallel/_common.py).
`traceview collect` wraps them unmodified. What each truth means:

- groups: the process groups as the job built them (torch's own group_name, group_desc, ranks;
  dim: the mesh dimension the job gave it). The trace declares the same in
  distributedInfo.pg_config (a rank lists only the groups it belongs to).
- pipeline stage s, per step: schedule = schedule.step()'s wall time; compute = the stage's
  forward_one_chunk + loss + backward_one_chunk (the schedule's own actions, timed by wrapping
  them: a module's backward hooks never fire on stage 0, whose input needs no gradient);
  bubble = schedule - compute (the issue's definition).
- arrival, per collective call: a rank's wait = the last rank's issue time minus its own (one
  machine, one CLOCK_MONOTONIC for all ranks).

A truth step is matched to the trace's ProfilerStep#N by clock: a Kineto event's
ts * 1000 + baseTimeNanoseconds is UNIX time in ns, and each truth file holds one simultaneous
read of perf_counter_ns and time_ns.

Set TV_PARALLEL_JOBS=DIR to read DIR/<job>/{run,truth} made earlier instead of running the jobs.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import REPO, run_cli, run_job

pytestmark = [pytest.mark.torch]

WORKLOADS = REPO / "tests" / "workloads" / "parallel"

# name: (ranks, script, its arguments)
JOBS: dict[str, tuple[int, str, list[str]]] = {
    "fsdp2": (2, "fsdp.py", []),
    "fsdp2-prefetch": (2, "fsdp.py", ["--prefetch"]),  # forward all-gathers prefetched
    "mesh2d": (4, "mesh2d.py", []),
    "gpipe2-slow": (2, "pipeline.py", ["--schedule", "gpipe", "--microbatches", "4",
                                       "--slow-stage", "1", "--slow-phase", "forward"]),
    "gpipe2-balanced": (2, "pipeline.py", ["--schedule", "gpipe", "--microbatches", "4"]),
    "1f1b2-slowbwd": (2, "pipeline.py", ["--schedule", "1f1b", "--microbatches", "4",
                                         "--slow-stage", "0", "--slow-phase", "backward",
                                         "--extra", "100"]),
    "gpipe4-balanced": (4, "pipeline.py", ["--schedule", "gpipe", "--microbatches", "4"]),
    "1f1b4-slow": (4, "pipeline.py", ["--schedule", "1f1b", "--microbatches", "8",
                                      "--slow-stage", "2", "--slow-phase", "forward"]),
    "1f1b4-balanced": (4, "pipeline.py", ["--schedule", "1f1b", "--microbatches", "8"]),
    # two stages per rank (rank r holds stages r and r + P): a ring of ranks from 3 ranks on
    "interleaved2-balanced": (2, "pipeline.py", ["--schedule", "interleaved", "--microbatches",
                                                 "4"]),
    "interleaved2-slow": (2, "pipeline.py", ["--schedule", "interleaved", "--microbatches", "4",
                                             "--slow-stage", "1", "--slow-phase", "forward"]),
    "interleaved4-balanced": (4, "pipeline.py", ["--schedule", "interleaved", "--microbatches",
                                                 "4"]),
    # one virtual stage slow (stage 2, on rank 0 beside stage 0)
    # (80 extra matmuls, where the others' 40 do: at 40 the stage took 2x the others and on a
    # loaded machine gloo's transfers, stretched as long, were the cause as often as the stage)
    "interleaved2-slowvirtual": (2, "pipeline.py", ["--schedule", "interleaved",
                                                    "--microbatches", "4", "--slow-virtual", "2",
                                                    "--slow-phase", "forward", "--extra", "80"]),
    "arrival3": (3, "arrival.py", ["--slow-rank", "2"]),
    "arrival4": (4, "arrival.py", ["--slow-rank", "3"]),  # more ranks than the 2 cores
}  # fmt: skip
PIPELINES = [j for j in JOBS if JOBS[j][1] == "pipeline.py"]
SLOW_PIPELINES = [j for j in PIPELINES if "slow" in j and "virtual" not in j]
BALANCED_PIPELINES = [j for j in PIPELINES if "balanced" in j and "interleaved" not in j]
ARRIVAL = ["arrival3", "arrival4"]
MESH_JOBS = ["fsdp2", "fsdp2-prefetch", "mesh2d"]


@dataclass
class Job:
    name: str
    dir: Path
    ranks: int
    _report: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def run(self) -> Path:
        return self.dir / "run"

    @cached_property
    def truth(self) -> list[dict[str, Any]]:
        return [
            json.loads((self.dir / "truth" / f"rank{r}.json").read_text())
            for r in range(self.ranks)
        ]

    @cached_property
    def traces(self) -> list[dict[str, Any]]:
        out = []
        for r in range(self.ranks):
            (path,) = (self.run / "raw" / f"rank-{r:05d}").glob("*.pt.trace.json*")
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt") as f:
                out.append(json.load(f))
        return out

    @cached_property
    def timers(self) -> pl.DataFrame:
        """Every timer row of every rank, with `tstep`: the trace's step (ProfilerStep#N) the
        timer's job step was recorded as, null for the steps not recorded."""
        frames = []
        for r, t in enumerate(self.truth):
            rows = pl.DataFrame(t["timers"], infer_schema_length=None).with_columns(
                pl.lit(r).alias("rank"), ((pl.col("t1_ns") - pl.col("t0_ns")) / 1e6).alias("ms")
            )
            for col in ("op", "group", "phase", "bytes", "unit"):
                if col not in rows.columns:
                    rows = rows.with_columns(pl.lit(None).alias(col))
            mapping = self.recorded_steps(r)
            frames.append(
                rows.select("rank", "name", "step", "mb", "t0_ns", "t1_ns", "ms", "op", "group",
                            pl.col("phase").cast(pl.Utf8), pl.col("bytes").cast(pl.Int64),
                            pl.col("unit").cast(pl.Utf8))
                .with_columns(pl.col("step").replace_strict(mapping, default=None).alias("tstep"))
            )  # fmt: skip
        return pl.concat(frames)

    def recorded_steps(self, rank: int) -> dict[int, int]:
        """job step -> ProfilerStep#N of this rank's trace, matched by clock as one offset for
        all steps (both count up one by one): the offset under which the profiler steps overlap
        their job steps most. A ProfilerStep starts inside the optimizer step's hook, microseconds
        before the job's step timer ends, so one step alone can be matched wrong: a rank
        descheduled between that hook and the timer's end leaves the next ProfilerStep mostly
        in the job step before it."""
        truth, trace = self.truth[rank], self.traces[rank]
        to_epoch = truth["clock"]["time_ns"] - truth["clock"]["perf_counter_ns"]
        spans = {
            t["step"]: (t["t0_ns"] + to_epoch, t["t1_ns"] + to_epoch)
            for t in truth["timers"]
            if t["name"] == "step"
        }
        base = trace["baseTimeNanoseconds"]
        profiled = {
            int(e["name"].split("#")[1]): (
                e["ts"] * 1000 + base,
                (e["ts"] + e["dur"]) * 1000 + base,
            )
            for e in trace["traceEvents"]
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
        }

        def overlap(step: int, at: float, end: float) -> float:
            span = spans.get(step)
            return 0.0 if span is None else min(span[1], end) - max(span[0], at)

        offsets = {n - s for n in profiled for s in spans}
        offset = max(offsets, key=lambda k: sum(overlap(n - k, *profiled[n]) for n in profiled))
        out = {}
        for n, (at, end) in profiled.items():
            step = n - offset
            assert step in spans, f"rank {rank}: ProfilerStep#{n} has no job step"
            # the last recorded job step also holds the profiler's stop and the trace's export
            shorter = min(spans[step][1] - spans[step][0], end - at)
            assert overlap(step, at, end) > 0.5 * shorter, (
                f"rank {rank}: ProfilerStep#{n} is no step"
            )
            out[step] = n
        return out

    def recorded(self, name: str) -> pl.DataFrame:
        return self.timers.filter(pl.col("name") == name, pl.col("tstep").is_not_null())

    def report(self) -> dict[str, Any]:
        if self._report is None:
            result = run_cli("report", self.run, "--json")
            assert result.code == 0, result.err
            self._report = json.loads(result.out)
        return self._report

    def counted(self) -> list[int]:
        """The trace steps the report counts (per_step[].excluded null)."""
        return [s["step"] for s in self.report()["per_step"] if s.get("excluded") is None]


def _launcher() -> list[str]:
    pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU build)")
    try:
        import torch.distributed.run  # noqa: F401  (torchrun's own module)
    except ImportError:
        pytest.skip("torchrun (torch.distributed.run) is missing from this PyTorch")
    # `python -m torch.distributed.run` is torchrun; the console script may not be on PATH
    return [sys.executable, "-m", "torch.distributed.run", "--standalone"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """job(name) runs that job once under `traceview collect` (module-wide) and returns it."""
    return job_maker(tmp_path_factory)


def job_maker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """job(name): that job run once under `traceview collect` (into ``tmp_path_factory``), or
    read from TV_PARALLEL_JOBS where it was made earlier."""
    made: dict[str, Job] = {}
    reuse = os.environ.get("TV_PARALLEL_JOBS")

    def job(name: str, again: bool = False) -> Job:
        """``again``: run it anew (a job whose timing the shared machine's load distorted)."""
        if name in made and not again:
            return made[name]
        ranks, script, args = JOBS[name]
        if reuse and not again and (Path(reuse) / name / "truth").is_dir():
            made[name] = Job(name, Path(reuse) / name, ranks)
            return made[name]
        launcher = _launcher()
        out = tmp_path_factory.mktemp(name)
        cmd = [
            "collect", "-o", out / "run", "--steps", "5", "--warmup", "2", "--skip", "1",
            "--no-report", "--", *launcher, "--nproc-per-node", str(ranks), WORKLOADS / script,
            "--steps", "10", "--truth", out / "truth", *args,
        ]  # fmt: skip
        result = run_job(lambda: run_cli(*cmd), out / "run", out / "truth")
        assert result.code == 0, result.out[-2000:] + result.err[-2000:]
        made[name] = Job(name, out, ranks)
        return made[name]

    return job


def _virtual(job: Job) -> int:
    """Stages per rank: the job's own (stage_indices)."""
    return len(job.truth[0].get("stage_indices") or [0])


def _mean_per_step(frame: pl.DataFrame, *by: str) -> pl.DataFrame:
    """Sum each (rank, step) then average the recorded steps."""
    return (
        frame.group_by("rank", "tstep", *by)
        .agg(pl.col("ms").sum())
        .group_by("rank", *by)
        .agg(pl.col("ms").mean())
        .sort("rank", *by)
    )


def stage_truth(job: Job) -> pl.DataFrame:
    """Per stage (= rank): schedule, compute (forward + loss + backward), bubble, p2p wait and
    the forward and backward compute, in ms per step the report counts (a slow leading step
    it leaves out as warm-up, which a loaded machine can make, would weigh on the timers' mean
    alone)."""
    names = ["schedule", "stage_forward", "loss", "stage_backward", "p2p_wait"]
    per = (
        job.timers.filter(pl.col("tstep").is_in(job.counted()), pl.col("name").is_in(names))
        .group_by("rank", "tstep")
        .agg(pl.col("ms").filter(pl.col("name") == n).sum().alias(n) for n in names)
        .with_columns(
            (pl.col("stage_forward") + pl.col("loss") + pl.col("stage_backward")).alias("compute")
        )
        .with_columns((pl.col("schedule") - pl.col("compute")).alias("bubble"))
    )
    return per.group_by("rank").agg(pl.exclude("tstep").mean()).sort("rank")


def arrival_truth(job: Job, counted: set[int] | None = None) -> pl.DataFrame:
    """Per rank: wait per recorded step (the last rank's issue time minus its own, summed over
    the step's all-reduce calls) and the time blocked in the calls; ``counted``: only these
    trace steps (the ones the report counts: it leaves warm-up steps out)."""
    calls = job.timers.filter(pl.col("name") == "allreduce", pl.col("step") >= 0)
    calls = calls.with_columns(
        ((pl.col("t0_ns").max().over("step", "mb") - pl.col("t0_ns")) / 1e6).alias("wait")
    ).filter(pl.col("tstep").is_not_null())
    if counted is not None:
        calls = calls.filter(pl.col("tstep").is_in(sorted(counted)))
    return (
        calls.group_by("rank", "tstep")
        .agg(pl.col("wait").sum(), pl.col("ms").sum().alias("blocked"))
        .group_by("rank")
        .agg(pl.col("wait").mean(), pl.col("blocked").mean())
        .sort("rank")
    )


def _dim(desc: str | None) -> str | None:
    return desc[len("mesh_") :] if desc and desc.startswith("mesh_") else None


def declared_groups(job: Job) -> list[dict[str, Any]]:
    """The groups of the run, as the job built them (deduplicated over ranks and by name: a 1-D
    mesh over the whole world reuses the default group, so its group says "default_pg")."""
    seen: dict[str, dict[str, Any]] = {}
    for t in job.truth:
        for g in t["groups"]:
            seen.setdefault(
                g["name"],
                {"name": g["name"], "desc": g["desc"], "dim": _dim(g["desc"]), "ranks": g["ranks"]},
            )
    return sorted(seen.values(), key=lambda g: g["name"])


# ---------------------------------------------------------------- what holds today


@pytest.mark.parametrize("name", list(JOBS))
def test_job_runs_traced_and_timed(jobs: Any, name: str) -> None:
    job = jobs(name)
    manifest = json.loads((job.run / "manifest.json").read_text())
    ranks = manifest["collect"]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(job.ranks))
    assert all(r["state"] == "ok" and r["trace"] for r in ranks), ranks
    # every rank recorded 5 steps, matched by clock to 5 consecutive job steps
    for r in range(job.ranks):
        mapping = job.recorded_steps(r)
        assert len(mapping) == 5
        assert sorted(mapping) == list(range(min(mapping), min(mapping) + 5))
    # the timers nest: each phase lies within its step, and the phases fit in the step
    steps = job.timers.filter(pl.col("name") == "step").select(
        "rank", "step", pl.col("t0_ns").alias("s0"), pl.col("t1_ns").alias("s1"), pl.col("ms").alias("wall")
    )  # fmt: skip
    inner = job.timers.filter(pl.col("name") != "step").join(steps, on=["rank", "step"])
    assert inner.filter(
        (pl.col("t0_ns") < pl.col("s0")) | (pl.col("t1_ns") > pl.col("s1"))
    ).is_empty()
    phases = ["forward", "backward", "update", "schedule"]
    summed = (
        inner.filter(pl.col("name").is_in(phases))
        .group_by("rank", "step")
        .agg(pl.col("ms").sum(), pl.col("wall").first())
    )
    assert summed.filter(pl.col("ms") > pl.col("wall")).is_empty()


@pytest.mark.parametrize("name", ["mesh2d", "fsdp2", "gpipe4-balanced"])
def test_trace_declares_the_groups_the_job_built(jobs: Any, name: str) -> None:
    """distributedInfo.pg_config on each rank lists exactly the groups that rank belongs to, with
    the job's own names, descriptions and ranks (what the analysis may rely on)."""
    job = jobs(name)
    for r, (truth, trace) in enumerate(zip(job.truth, job.traces, strict=True)):
        info = trace["distributedInfo"]
        assert info["backend"] == "gloo" and info["rank"] == r
        declared = {(g["pg_name"], g["pg_desc"], tuple(g["ranks"])) for g in info["pg_config"]}
        built = {(g["name"], g["desc"], tuple(g["ranks"])) for g in truth["groups"]}
        assert declared == built


@pytest.mark.parametrize("name", PIPELINES)
def test_stage_timers_are_consistent(jobs: Any, name: str) -> None:
    """The stage timers time what they claim: one forward and one backward action per
    micro-batch, compute and waits inside the schedule; the module's own forward (hooks) inside
    each forward action; backward hooks that miss stage 0's backward (why the job times the
    schedule's actions instead)."""
    job = jobs(name)
    m = job.truth[0]["microbatches"] * _virtual(job)  # (actions: per stage the rank holds)
    for r in range(job.ranks):
        for action in ("stage_forward", "stage_backward", "module_forward"):
            counts = job.recorded(action).filter(pl.col("rank") == r).group_by("tstep").len()
            assert counts["len"].to_list() == [m] * 5, (r, action)
        # stage 0's full backward hooks fire (torch warns: "firing when gradients are computed
        # with respect to module outputs since no inputs require gradients"), both at once,
        # before its backward runs: they time next to nothing
        hooks = job.recorded("module_backward").filter(pl.col("rank") == r)["ms"].sum()
        backward = job.recorded("stage_backward").filter(pl.col("rank") == r)["ms"].sum()
        if r == 0 and _virtual(job) > 1:
            assert hooks <= backward  # (its later stages' hooks fire as any other stage's)
        elif r == 0:
            assert hooks < 0.2 * backward, (hooks, backward)
        else:
            assert 0.5 * backward < hooks <= backward, (r, hooks, backward)
        forward = job.recorded("stage_forward").filter(pl.col("rank") == r)["ms"].sum()
        module = job.recorded("module_forward").filter(pl.col("rank") == r)["ms"].sum()
        assert 0.6 * forward <= module <= forward  # forward_one_chunk: +10-25% of its own
    truth = stage_truth(job)
    assert (truth["bubble"] >= 0).all() and (truth["p2p_wait"] <= truth["bubble"]).all()


@pytest.mark.parametrize("name", SLOW_PIPELINES)
def test_slow_stage_is_slow_in_its_phase(jobs: Any, name: str) -> None:
    job = jobs(name)
    args = job.truth[0]["args"]
    slow, phase = args["slow_stage"], args["slow_phase"]
    column = {"forward": "stage_forward", "backward": "stage_backward"}[phase]
    truth = stage_truth(job)
    mine = truth.filter(pl.col("rank") == slow)[column].item()
    others = truth.filter(pl.col("rank") != slow)[column]
    assert mine > 1.5 * others.max(), truth


@pytest.mark.parametrize("name", ARRIVAL)
def test_arrival_truth_is_self_consistent(jobs: Any, name: str) -> None:
    job = jobs(name)
    slow = job.truth[0]["slow_rank"]
    truth = arrival_truth(job)
    fast = truth.filter(pl.col("rank") != slow)
    # the slow rank arrives last (waits little) and the others wait for it, blocked at least
    # as long as they wait
    # (on a loaded machine a fast rank can be scheduled late, so only: less than the others')
    assert truth.filter(pl.col("rank") == slow)["wait"].item() < fast["wait"].max()
    assert (fast["blocked"] >= fast["wait"]).all()


# ---------------------------------------------------------------- issue 32's contract


@pytest.mark.parametrize("name", [*MESH_JOBS, "gpipe2-slow"])
def test_report_lists_the_groups_as_built(jobs: Any, name: str) -> None:
    job = jobs(name)
    groups = sorted(job.report()["groups"], key=lambda g: g["name"])
    assert [{k: g[k] for k in ("name", "desc", "dim", "ranks")} for g in groups] == (
        declared_groups(job)
    )


@pytest.mark.parametrize("name", MESH_JOBS)
def test_no_matched_call_spans_two_groups(jobs: Any, name: str) -> None:
    """Every collective is matched inside one group the run declares, with as many participants
    as the group has ranks; the ops and groups are those the job issued."""
    job = jobs(name)
    report = job.report()
    declared = {tuple(g["ranks"]) for g in declared_groups(job)}
    for c in report["collectives"]:
        assert tuple(c["group_ranks"]) in declared, c
        assert c["ranks"] == len(c["group_ranks"]), c
    # the ops per group size the job issued (tp all-reduces in groups of 2 on the mesh)
    calls = job.timers.filter(pl.col("name") == "call")
    sizes = {g["name"]: len(g["ranks"]) for t in job.truth for g in t["groups"]}
    issued_pairs = {(op, sizes[g]) for op, g in calls.select("op", "group").unique().iter_rows()}
    reported = {(c["op"], len(c["group_ranks"])) for c in report["collectives"]}
    assert reported == issued_pairs


@pytest.mark.parametrize("name", MESH_JOBS)
def test_comm_by_group_counts_the_calls_per_phase(jobs: Any, name: str) -> None:
    """comm_by_group: per group, phase and op, the calls per step the job issued (FSDP2: all-
    gathers in forward and again in backward, reduce-scatters in backward; the mesh's tp
    all-reduces in forward and backward) and their bytes (input or output sizes)."""
    job = jobs(name)
    calls = job.recorded("call")
    size = {g["name"]: len(g["ranks"]) for t in job.truth for g in t["groups"]}
    desc = {g["name"]: g["desc"] for t in job.truth for g in t["groups"]}
    expected = (
        calls.group_by("rank", "tstep", "group", "phase", "op")
        .agg(pl.len().alias("n"), pl.col("bytes").sum())
        .group_by("group", "phase", "op")
        .agg(pl.col("n").mean(), pl.col("bytes").mean())
    )
    rows = {(tuple(r["ranks"]), r["phase"], r["op"]): r for r in job.report()["comm_by_group"]}
    for group, phase, op, n, nbytes in expected.iter_rows():
        ranks = next(g["ranks"] for t in job.truth for g in t["groups"] if g["name"] == group)
        row = rows[(tuple(ranks), phase, op)]
        assert row["dim"] == _dim(desc[group])
        assert row["calls_per_step"] == pytest.approx(n)
        # the job counts each call's input; the trace also gives the output (all-gather: size x
        # the input, reduce-scatter: the input / size)
        assert any(
            row["bytes_per_step"] == pytest.approx(nbytes * k, rel=0.01)
            for k in (1, size[group], 1 / size[group])
        ), (row, nbytes)
        assert row["total_ms"] >= row["exposed_ms"] >= 0
        assert row["wait_ms"] + row["transfer_ms"] + row["queued_ms"] == pytest.approx(
            row["total_ms"], abs=0.05
        )


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2-prefetch"])
def test_fsdp_gathers_prefetched_and_ready_as_the_job_timed_them(jobs: Any, name: str) -> None:
    """fsdp_gathers, unit by unit. Prefetched as the job built it: in forward only where it set
    each unit to prefetch the next (--prefetch: every unit but the first); in backward FSDP2's
    own default, every unit but the first one backward. How far ahead of its use each was done:
    the job's timers, from the return of FSDP's unshard (on CPU its all-gather is done then) to
    FSDP's wait for the gathered parameters, median over the counted steps, within 25% or 1 ms
    (the trace ends the gather when gloo's worker ends it, before the call returns: 0.17 ms
    later on an idle 2-core machine, more when loaded: 0.70 ms once under the whole suite). A gather that is not prefetched is
    waited for at once: about 0.1-0.3 ms; a prefetched one in backward, milliseconds. (Ending
    each gather where the host call that queued it returns reads 0.6 ms for the first unit's.)"""
    against_timers_once_more(jobs, name, _gathers_against_timers)


def against_timers_once_more(jobs: Any, name: str, check: Any) -> None:
    """``check(job)`` on the job; where it fails, once more on a new run of the job. The timers
    and the trace sit microseconds apart on an idle machine, but a busy one (CI's, with the
    rest of the suite) can park a rank between its timer and the traced call for milliseconds
    (seen: 1.5 ms of an FSDP gather, 1.9 ms of a wait with 4 ranks on 2 cores)."""
    try:
        check(jobs(name))
    except AssertionError as first:
        print(f"{name}: {first}; run again")
        check(jobs(name, again=True))


def _gathers_against_timers(job: Job) -> None:
    name = job.name
    report = job.report()
    counted = set(job.counted())
    gathers = {(g["phase"], g["unit"]): g for g in report["fsdp_gathers"]}
    units = ["0", "2", "4", "6"]
    assert set(gathers) == {(p, u) for p in ("forward", "backward") for u in units}, gathers
    ahead_in_forward = {"2", "4", "6"} if "prefetch" in name else set()
    for u in units:
        assert gathers[("forward", u)]["prefetched"] == (1.0 if u in ahead_in_forward else 0.0)
        assert gathers[("backward", u)]["prefetched"] == (0.0 if u == "6" else 1.0)
        for phase in ("forward", "backward"):
            assert gathers[(phase, u)]["calls_per_step"] == 1.0
            assert gathers[(phase, u)]["total_ms"] >= gathers[(phase, u)]["exposed_ms"] >= 0
    timers = job.timers.filter(pl.col("tstep").is_in(sorted(counted)))
    unshard = timers.filter(pl.col("name") == "unshard").sort("t1_ns")
    needed = timers.filter(pl.col("name") == "needed").sort("t0_ns")
    paired = needed.join_asof(
        unshard.select("rank", "unit", pl.col("t1_ns").alias("done"),
                       pl.col("phase").alias("issued_in")),
        left_on="t0_ns", right_on="done", by=["rank", "unit"], strategy="backward",
    )  # fmt: skip
    truth = paired.group_by("issued_in", "unit").agg(
        ((pl.col("t0_ns") - pl.col("done")) / 1e6).median().alias("ahead")
    )
    assert truth.height == len(gathers), truth
    for phase, unit, ahead in truth.iter_rows():
        got = gathers[(phase, unit)]["ahead_ms"]
        print(f"{name} {phase} unit {unit}: ahead {got} ms, timers {ahead:.3f} ms")
        assert got == pytest.approx(ahead, rel=0.25, abs=1.0), (phase, unit, got, ahead)
        assert got >= ahead - 0.1, (phase, unit, got, ahead)  # (the worker ends first)


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_stages_and_bubble_match_the_timers(jobs: Any, name: str) -> None:
    """Each stage's bubble within 15% of its timers (schedule wall time minus its own compute),
    compute likewise; the schedule, micro-batches and the ideal bubble (p-1)/(m+p-1).

    The timers and the trace part ways on one thing only: Python that runs no operator. Inside
    a stage's forward or backward the timers count it as compute; between the schedule's actions
    as bubble. The trace sees neither, so the report counts all of it as bubble and says how much
    it was (the rank's idle, a few ms a step on loaded cores): the bubble is held to 15% of the
    timers' plus that idle (a 9.4 ms bubble once read 10.9 ms beside 1.5 ms of such Python).

    With several stages per rank the runtime waits for its sends late, so a send is in flight
    through most of the stage's Python: that time is communication by the attribution rule (no
    operator runs, a call is in flight), not idle, and the bubble reads 5-9 ms above the timers
    (24.5 -> 29.8, 15.8 -> 24.7 ms). There the bubble is held from below only: the report never
    counts time a stage was blocked as its compute, and its compute and bubble together are the
    stage's wall time (the same Python read 8 ms a step below the timers' compute on idle cores,
    20 ms with four ranks on two loaded cores)."""
    job = jobs(name)
    report = job.report()
    pipe = report["pipeline"]
    idle = {r["rank"]: r["breakdown_ms"]["idle"] for r in report["ranks"]}
    p, m, v = job.ranks, job.truth[0]["microbatches"], _virtual(job)
    assert pipe["schedule"].lower() == job.truth[0]["args"]["schedule"].lower()
    assert pipe["microbatches"] == m
    # virtual stages are stages, numbered as the schedule numbers them (rank r holds r, r + p)
    assert (pipe["virtual_stages"], pipe["stage_count"]) == (v, v * p)
    # interleaved with v stages per rank: (p - 1) / (v m + p - 1)
    assert pipe["ideal_bubble_fraction"] == pytest.approx((p - 1) / (v * m + p - 1))
    truth = stage_truth(job)
    listed = sorted(pipe["stages"], key=lambda s: s["stage"])
    assert [(s["stage"], s["ranks"]) for s in listed] == [(k, [k % p]) for k in range(v * p)]
    # a rank's stages together: their compute adds up to the rank's, their bubble is the rank's
    stages = [
        {
            "stage": r,
            "ranks": [r],
            "compute_ms": sum(s["compute_ms"] for s in listed if s["ranks"] == [r]),
            "bubble_ms": listed[r]["bubble_ms"],
        }
        for r in range(p)
    ]
    for s, t in zip(stages, truth.iter_rows(named=True), strict=True):
        print(f"stage {s['stage']}: bubble {s['bubble_ms']:.2f} ms, timers {t['bubble']:.2f} ms; "
              f"compute {s['compute_ms']:.2f} / {t['compute']:.2f} ms; "
              f"ideal bubble fraction {pipe['ideal_bubble_fraction']:.3f}")  # fmt: skip
        unplaced = sum(idle[r] for r in s["ranks"]) / len(s["ranks"])
        slack = max(0.15 * t["bubble"], 1.0) + unplaced
        compute_slack = max(0.15 * t["compute"], 1.0) + unplaced
        if v > 1:
            # the stage's Python with a send in flight moves from compute to bubble, never back:
            # compute held from above, the stage's whole wall time (compute + bubble) both ways
            assert s["bubble_ms"] >= t["bubble"] - slack, (s, t, unplaced)
            assert s["compute_ms"] <= t["compute"] + compute_slack, (s, t, unplaced)
            wall, timed = s["compute_ms"] + s["bubble_ms"], t["compute"] + t["bubble"]
            assert abs(wall - timed) <= 0.15 * timed + unplaced, (s, t, unplaced)
            assert s["compute_ms"] >= 0.5 * t["compute"], (s, t)  # not the sends' time as bubble
        else:
            assert abs(s["bubble_ms"] - t["bubble"]) <= slack, (s, t, unplaced)
            assert abs(s["compute_ms"] - t["compute"]) <= compute_slack, (s, t, unplaced)
    measured = truth["bubble"].sum() / truth["schedule"].sum()
    if v == 1:
        assert pipe["bubble_fraction"] == pytest.approx(measured, rel=0.15, abs=0.02)
    else:
        assert pipe["bubble_fraction"] >= measured - 0.02


@pytest.mark.parametrize("name", SLOW_PIPELINES)
def test_slow_stage_and_its_phase_are_named(jobs: Any, name: str) -> None:
    job = jobs(name)
    args = job.truth[0]["args"]
    summary = job.report()["summary"]
    # the bottleneck follows the cause (issue 48): the slow stage's phase where the critical
    # path names that stage's work, else the pipeline's bubble
    cause = summary["cause"]
    if cause is not None and cause["rank"] == args["slow_stage"]:
        assert (cause["phase"], summary["bottleneck"]) == (args["slow_phase"],) * 2, cause
    elif cause is not None and cause["kind"] == "transfer":
        # (more ranks than cores: messages wait for a core to move, and exposed transfer can
        # cost more than the slow stage; the bottleneck follows the cause)
        assert summary["bottleneck"] == "comm", cause
    else:
        assert summary["bottleneck"] == "pipeline", cause
    assert summary["straggler_rank"] == args["slow_stage"]
    assert summary["straggler_phase"] == args["slow_phase"]


@pytest.mark.parametrize("name", BALANCED_PIPELINES)
def test_balanced_pipeline_bubble_near_the_ideal(jobs: Any, name: str) -> None:
    """Where the timers themselves find the bubble near the schedule's ideal (equal stages; on
    a loaded machine gloo's latency can add more), so does the report."""
    job = jobs(name)
    pipe = job.report()["pipeline"]
    truth = stage_truth(job)
    ideal = pipe["ideal_bubble_fraction"]
    measured = truth["bubble"].sum() / truth["schedule"].sum()
    print(f"bubble fraction: timers {measured:.3f}, report {pipe['bubble_fraction']:.3f}, "
          f"ideal {ideal:.3f}")  # fmt: skip
    if abs(measured - ideal) <= 0.25 * ideal:
        assert abs(pipe["bubble_fraction"] - ideal) <= 0.3 * ideal
    else:
        assert pipe["bubble_fraction"] == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize("name", PIPELINES)
def test_point_to_point_is_paired_and_fast(jobs: Any, name: str) -> None:
    """Sends and receives of 8 KiB between neighbouring stages: matched in pairs (never a
    collective of the whole world), under 1 ms of transfer a call on one machine; what the
    receiver spends blocked before its peer sends is wait."""
    job = jobs(name)
    p2p = [c for c in job.report()["collectives"] if c["op"] in ("send", "recv")]
    assert p2p
    # under 1 ms where every rank has cores to spare; ranks sharing too few cores wait for one
    # to run gloo's thread (a few ms on 2 loaded cores, more the more ranks share each core)
    cores = os.cpu_count() or 1
    bound = 1.0 if cores >= 2 * job.ranks else 5.0 * max(1.0, job.ranks / cores)
    for c in p2p:
        assert c["ranks"] == 2, c
        assert c["bytes"] == job.truth[0]["message_bytes"], c
    transfer = sorted(c["transfer_ms"] for c in p2p)
    if _virtual(job) > 1 and cores < 2 * job.ranks:
        return  # (an interleaved schedule's three times as many messages on loaded cores: 7 ms)
    assert transfer[len(transfer) // 2] < bound, transfer  # (the median call)


@pytest.mark.parametrize("name", ARRIVAL)
def test_fast_ranks_wait_matches_their_timers(jobs: Any, name: str) -> None:
    """A rank's wait runs from the moment its program issued the all-reduce to the moment the
    last rank issued it (the timers around the calls, on one clock); the gloo worker thread's
    later start is not transfer. The straggler is the rank the timers say the others waited
    for: the one that waited least, itself last to issue (usually the slow rank; with more
    ranks than cores a starved rank can arrive later still: a full run beside the fuzz tier
    once had rank 0 wait 0.00 ms by its timers, the slow rank 2.9 ms). Where two ranks' waits
    are within 1 ms of each other, either may be named."""
    against_timers_once_more(jobs, name, _waits_against_timers)


def _waits_against_timers(job: Job) -> None:
    slow = job.truth[0]["slow_rank"]
    truth = arrival_truth(job, set(job.counted()))
    ranks = {r["rank"]: r for r in job.report()["ranks"]}
    for t in truth.filter(pl.col("rank") != slow).iter_rows(named=True):
        got = ranks[t["rank"]]["comm_wait_ms"]
        print(f"rank {t['rank']}: wait {got:.2f} ms, timers {t['wait']:.2f} ms "
              f"(blocked {t['blocked']:.2f} ms)")  # fmt: skip
        assert got == pytest.approx(t["wait"], rel=0.15, abs=1.0), (t, got)
    least = truth.sort("wait").rows(named=True)
    waited_for = [r["rank"] for r in least if r["wait"] < least[0]["wait"] + 1.0]
    assert job.report()["summary"]["straggler_rank"] in waited_for, (least, waited_for)


def _copy_traces(job: Job, out: Path, shift_us: dict[int, float]) -> Path:
    """The job's raw traces in ``out``, rank r's on a host of its own with every timestamp moved
    by ``shift_us[r]`` (as if read from several machines whose clocks differ); ranks absent from
    ``shift_us`` keep the trace's clock and host."""
    out.mkdir()
    for r, trace in enumerate(job.traces):
        if r in shift_us:
            trace = {**trace, "host_name": f"other-host-{r}"}
            trace["traceEvents"] = [
                {**e, "ts": e["ts"] + shift_us[r]} if "ts" in e else e for e in trace["traceEvents"]
            ]
        with gzip.open(out / f"rank-{r}.pt.trace.json.gz", "wt") as f:
            json.dump(trace, f)
    return out


@pytest.mark.parametrize("name", ["gpipe2-slow", "1f1b4-balanced"])
def test_pipeline_across_hosts_gets_its_clock_offsets(jobs: Any, name: str, tmp_path: Path) -> None:
    """A pipeline makes no synchronizing collective: with its stages' clocks apart (each on a host
    of its own, timestamps moved by known offsets), the matched sends and receives give the
    offsets, chained stage to stage, each within the transfer time the messages take (measured
    on the traces' own common clock); without them the waits would be off by the offsets."""
    job = jobs(name)
    shifts = {1: 23_456.7, 2: -41_302.5, 3: 7_050.0}
    shift_us = {r: shifts[r] for r in range(1, job.ranks)}
    shifted = _copy_traces(job, tmp_path / "shifted", shift_us)
    same = _copy_traces(job, tmp_path / "same", {})
    result = run_cli("report", same, "--json")
    assert result.code == 0, result.err
    p2p = [c for c in json.loads(result.out)["collectives"] if c["op"] in ("send", "recv")]
    transfer_us = max(c["transfer_ms"] for c in p2p) * 1e3
    result = run_cli("report", shifted, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    clocks = report["run"]["clocks"]
    assert clocks["source"] == "collectives" and clocks["unaligned_ranks"] == [], clocks
    for row in report["ranks"]:
        truth = shift_us.get(row["rank"], 0.0)
        print(f"rank {row['rank']}: offset {row['clock_offset_us']:.1f} µs, shifted by "
              f"{truth:.1f} µs (transfer up to {transfer_us:.1f} µs)")  # fmt: skip
        assert abs(row["clock_offset_us"] - truth) <= transfer_us, (row["rank"], transfer_us)
    assert report["pipeline"] is not None
    assert len(report["pipeline"]["stages"]) == job.ranks


def test_a_stage_missing_from_the_set_is_one_warning_and_the_rest_is_analysed(
    jobs: Any, tmp_path: Path
) -> None:
    """The 4-stage job read without stage 2's trace: one warning names the stage and counts the
    calls its neighbours made with it; the three stages read are still a pipeline, each with
    the figures it has when all four are read."""
    job = jobs("1f1b4-balanced")
    folder = tmp_path / "three"
    folder.mkdir()
    for r, trace in enumerate(job.traces):
        if r != 2:
            with gzip.open(folder / f"rank-{r}.pt.trace.json.gz", "wt") as f:
                json.dump(trace, f)
    result = run_cli("report", folder, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    [warning] = [w for w in report["warnings"] if w.startswith("pipeline:")]
    # 8 micro-batches a step: stage 1 and stage 3 each send 8 and receive 8 with stage 2
    steps = report["run"]["steps"]
    assert "stage 2 (rank 2)" in warning
    assert f"{2 * 16 * steps} point-to-point call(s)" in warning, warning
    pipe = report["pipeline"]
    assert pipe is not None and [s["stage"] for s in pipe["stages"]] == [0, 1, 3]
    assert pipe["stage_count"] == 4
    assert pipe["microbatches"] == 8
    text = run_cli("report", folder)
    assert "pipeline: 4 stages (stage 2 without a trace) × 8 micro-batches" in text.out
    whole = {s["stage"]: s for s in job.report()["pipeline"]["stages"]}
    for s in pipe["stages"]:
        assert s["compute_ms"] == pytest.approx(whole[s["stage"]]["compute_ms"], rel=0.05)


WANT_KEYS = ("kind", "rank", "stage", "phase", "change")


def test_a_slow_virtual_stage_is_named_as_a_stage(jobs: Any) -> None:
    """Interleaved 1F1B, 2 ranks x 2 stages, stage 2 (rank 0, beside stage 0) does 80 extra
    matmuls a micro-batch in its forward: the slowest stage is stage 2, in its forward; each
    stage's compute is its own actions' work, within 15% of its timers (the schedule's
    forward_one_chunk and backward_one_chunk on that stage, which on rank 1 also wait for their
    inputs: the report leaves the wait out, so it is held from above there); the verdict does
    not say a stage waits for another stage of its own rank; the report's cause is stage 2's
    forward, its change stage 2 balanced alone (balance:stage=2, as `whatif --balance-stage 2`
    replays it), and removing it saves time (5% of the step or more, no more than its blame)."""
    job = jobs("interleaved2-slowvirtual")
    report = job.report()
    pipe = report["pipeline"]
    assert (pipe["slowest_stage"], pipe["slowest_phase"]) == (2, "forward"), pipe
    counted = set(job.counted())
    last = pipe["stage_count"] - 1  # (the loss: inside the last stage's forward action)
    rows = []
    for r, t in enumerate(job.truth):
        mapping = job.recorded_steps(r)
        for row in t["timers"]:
            named = row["name"] in ("stage_forward", "stage_backward", "loss")
            if named and mapping.get(row["step"]) in counted:
                stage = last if row["name"] == "loss" else row["stage"]
                rows.append((stage, (row["t1_ns"] - row["t0_ns"]) / 1e6))
    timed = pl.DataFrame(rows, schema=["stage", "ms"], orient="row")
    timed = timed.group_by("stage").agg(pl.col("ms").sum() / len(counted)).sort("stage")
    ours = {s["stage"]: s for s in pipe["stages"]}
    for stage, ms in timed.iter_rows():
        got = ours[stage]["compute_ms"]
        print(f"stage {stage}: compute {got:.2f} ms, timers {ms:.2f} ms")
        assert got <= ms * 1.15 + 1.0, (stage, got, ms)
        if stage % job.ranks == 0:  # (rank 0's actions hardly wait: stage 0 runs first)
            assert got == pytest.approx(ms, rel=0.15, abs=1.0), (stage, got, ms)
    assert ours[2]["compute_ms"] > 1.5 * max(ours[k]["compute_ms"] for k in (0, 1, 3))
    text = run_cli("report", job.run)
    assert text.code == 0, text.err
    assert "waiting for stage 0" not in text.out, text.out[:800]
    # the headline names the stage, never a balanced run beside a slow stage
    assert "balanced:" not in text.out, text.out[:800]
    # the cause is stage 2's forward, and removing it saves time: the replay lets rank 1's
    # receives complete once rank 0 sends (a receive moves once its rank waits for it; a send
    # is done when its receive is), where it kept them as long as they were measured (gloo
    # completes a message only once its receiver waits, and a sender's span lasts until the
    # schedule waits for its sends at the end: the replay then saved 1%). On a machine loaded
    # by other jobs, gloo's transfers stretch (seen once: removing communication saved more);
    # such a run is made again once before the cause fails it.
    want = ("compute", 0, 2, "forward", "balance:stage=2")
    cause = report["summary"]["cause"]
    if cause is None or tuple(cause[k] for k in WANT_KEYS) != want:
        job = jobs("interleaved2-slowvirtual", again=True)
        report = job.report()
        text = run_cli("report", job.run)
        cause = report["summary"]["cause"]
    assert cause is not None, report["summary"]
    got = tuple(cause[k] for k in WANT_KEYS)
    assert got == want, cause
    assert cause["ms"] >= 0.05 * (cause["step_ms"] + cause["ms"]), cause
    assert cause["ms"] <= cause["blamed_ms"] * 1.01, cause
    headline = next(line for line in text.out.splitlines() if line.startswith("cause: "))
    assert headline.startswith("cause: stage 2 (rank 0)'s forward"), text.out[:600]
    # balancing stage 2 alone shortens stage 2's work and nothing else (stage 0, on the same
    # rank, stays as it was): the step saves no more than the work taken away, stage 2's compute
    # above the other stages' median. (Not "no more than balancing rank 0 whole": that brings
    # rank 0 to rank 1's stages, which take longer than stage 0; it may save less.)
    ours = {s["stage"]: s for s in report["pipeline"]["stages"]}  # (the job made last)
    rest = statistics.median(ours[k]["compute_ms"] for k in (0, 1, 3))
    assert cause["ms"] <= (ours[2]["compute_ms"] - rest) * 1.1 + 1.0, (cause, ours)
    asked = run_cli("whatif", job.run, "--balance-stage", "2", "--json")
    assert asked.code == 0, asked.err
    (stage,) = [w for w in json.loads(asked.out)["whatif"] if w["change"] == "balance:stage=2"]
    assert stage["step_ms"] == pytest.approx(cause["step_ms"], rel=0.01), (stage, cause)


def test_the_tuis_overview_tells_fsdps_gathers_as_the_report_does(jobs: Any) -> None:
    """The TUI's overview lists FSDP's all-gathers per phase, the same words as `report`."""
    from textual.widgets import Static

    from tests.integration.test_tui import drive, plain
    from traceview.runs import open_run

    job = jobs("fsdp2-prefetch")
    text = run_cli("report", job.run)
    assert text.code == 0, text.err
    lines = text.out.splitlines()
    first = lines.index("FSDP all-gathers (ms per step, mean of the ranks)")
    seen: dict[str, str] = {}

    async def look(app: Any, pilot: Any) -> None:
        seen["notes"] = plain(app.query_one("#notes", Static))

    with open_run([job.run]) as run:
        drive([run], look)
    end = lines.index("", first)
    said = " ".join(" ".join(lines[first:end]).split())  # (the text report wraps its lines)
    assert said.startswith("FSDP all-gathers") and "in forward: 4 unit(s)" in said, said
    assert said in " ".join(seen["notes"].split()), (said, seen["notes"])


def test_the_tuis_fsdp_view_draws_each_units_gathers_where_the_job_timed_them(jobs: Any) -> None:
    """The timeline's FSDP view (f): under rank 0's row, a row per FSDP unit in the order their
    gathers were issued (units 0, 2, 4, 6), each saying how many of its step's gathers were
    prefetched as the job set it up (forward: every unit but the first; backward: FSDP2's
    default, every unit but the first one backward, unit 6); and each gather drawn where the
    job's timers put it: in flight (g or G) from FSDP's unshard call to its return (on CPU the
    gather is done then), within a cell either side, and, where a gather was done two cells or
    more before FSDP waited for it, ready (·) in between."""
    from tests.integration.test_tui import drive
    from traceview.runs import open_run
    from traceview.tui.timeline import Timeline

    job = jobs("fsdp2-prefetch")
    seen: dict[str, Any] = {}

    async def look(app: Any, pilot: Any) -> None:
        await pilot.press("2")
        await pilot.pause()
        timeline = app.query_one(Timeline)
        await pilot.press("f")
        await pilot.pause()
        width = timeline.bar_width()
        seen["step"], seen["range"], seen["width"] = timeline.step, timeline.range_of(0), width
        seen["rows"] = [
            (row.unit, timeline._label(row).plain, timeline._bar(row, width).plain)
            for row in timeline.rows
        ]

    with open_run([job.run]) as run:
        drive([run], look)
    units = [(unit, label, bar) for unit, label, bar in seen["rows"] if unit is not None]
    assert seen["rows"][0][0] is None and "rank 0" in seen["rows"][0][1], seen["rows"]
    assert [u for u, _, _ in units] == ["0", "2", "4", "6"], seen["rows"]
    prefetched = {"0": "1/2p", "2": "2/2p", "4": "2/2p", "6": "1/2p"}
    for unit, label, _ in units:
        assert label.split()[-1] == prefetched[unit], label
    # the job's timers of rank 0 in the step drawn, on the trace's clock
    truth = job.truth[0]
    to_epoch = truth["clock"]["time_ns"] - truth["clock"]["perf_counter_ns"]
    timers = job.timers.filter(pl.col("rank") == 0, pl.col("tstep") == seen["step"])
    (lo, hi), width = seen["range"], seen["width"]

    def column(t: int) -> int:
        return int((t + to_epoch - lo) / (hi - lo) * width)

    bars = {unit: bar for unit, _, bar in units}
    checked = 0
    for unit, phase, t0, t1 in (
        timers.filter(pl.col("name") == "unshard").select("unit", "phase", "t0_ns", "t1_ns")
    ).iter_rows():
        bar = bars[unit]
        a, b = max(column(t0) - 1, 0), min(column(t1) + 2, width)
        assert set(bar[a:b]) & {"g", "G"}, (unit, phase, a, b, bar)
        needed = timers.filter(
            pl.col("name") == "needed", pl.col("unit") == unit, pl.col("t0_ns") >= t1
        )["t0_ns"].min()
        if needed is not None and column(needed) - column(t1) >= 2:
            c, d = column(t1) + 1, column(needed)
            assert "·" in bar[c - 1 : d + 1], (unit, phase, c, d, bar)
            checked += 1
    assert checked >= 1, seen["rows"]  # (backward's prefetches are done milliseconds ahead)
