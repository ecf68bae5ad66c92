"""Parameter-server jobs read as what they are: real ps-lite jobs (MXNet's ``dist_sync`` and
``dist_async`` KVStore, a scheduler, servers and workers on 127.0.0.1) under ``traceview
collect``, each worker timing its own phases (tests/workloads/ps/mxnet_ps.py), one worker slowed
by 40 ms of matrix products in its forward.

What would fail if the reading were wrong: a server counted as a worker (it has no steps, and is
never a rank that did not finish), a wait reported where the workers do not wait for each other
(asynchronous mode), the synchronous wait of the fast worker not matching what its timers show
(its push-pull takes longer than the slow worker's by the time it waits for it), a worker's step
away from its timers, a cause that names a wait in an asynchronous job.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from tests.conftest import REPO, analysed, run_cli
from tests.live.test_mxnet import _mxnet_python
from traceview.model import schema as S

WORKLOAD = REPO / "tests" / "workloads" / "ps" / "mxnet_ps.py"
SLOW_RANK, SLOW_MS = 1, 40.0

#: name -> (KVStore, where the optimizer runs, how the workers step, workers, servers)
SCENARIOS: dict[str, tuple[str, str, str, int, int]] = {
    "sync": ("dist_sync", "server", "trainer", 2, 1),
    "async": ("dist_async", "server", "trainer", 2, 1),
    "sync-worker-update-2servers": ("dist_sync", "worker", "trainer", 2, 2),
    # the KVStore's own push of every gradient, then pull of every weight (the wait in the pull)
    "sync-push-pull": ("dist_sync", "server", "push-pull", 2, 1),
}


_RUNS: dict[str, tuple[str, Path, dict[str, Any]]] = {}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def ps_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, dict[str, Any]]:
    return _ps_run(request.param, tmp_path_factory)


def _ps_run(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, dict[str, Any]]:
    if name in _RUNS:
        return _RUNS[name]
    python = _mxnet_python()
    kvstore, update, how, workers, servers = SCENARIOS[name]
    work = tmp_path_factory.mktemp(f"ps-{name}")
    out, run = work / "out", work / "run"
    dmlc = Path(sys.executable).with_name("traceview-dmlc")
    launcher = str(dmlc) if dmlc.exists() else shutil.which("traceview-dmlc") or "traceview-dmlc"
    command = [
        sys.executable, "-m", "traceview", "collect", "--no-report", "-o", str(run), "--",
        launcher, "-n", str(workers), "-s", str(servers), str(python), str(WORKLOAD), str(out),
        "--kvstore", kvstore, "--update", update, "--step", how,
        "--slow-rank", str(SLOW_RANK), "--slow-ms", str(SLOW_MS),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = run_cli("report", run, "--json").json()
    _RUNS[name] = name, run, report
    return _RUNS[name]


def _timers(run: Path, out: Path) -> pl.DataFrame:
    rows = []
    for path in sorted(out.glob("timers-rank-*.json")):
        rows += json.loads(path.read_text())["steps"]
    return pl.DataFrame(rows)


def _missed_updates(timers: pl.DataFrame, slow: int, fast: int) -> float:
    """By the timers: the mean number of ``fast``'s step ends between two consecutive step ends
    of ``slow`` (its pull, then its push), over the time both workers ran steps."""
    lo = timers.group_by("rank").agg(pl.col("start_unix_us").min())["start_unix_us"].max()
    hi = timers.group_by("rank").agg(pl.col("end_unix_us").max())["end_unix_us"].min()
    ends = timers.filter(pl.col("rank") == fast)["end_unix_us"].sort().to_numpy()
    mine = timers.filter(pl.col("rank") == slow)["end_unix_us"].sort().to_numpy()
    pairs = [(a, b) for a, b in itertools.pairwise(mine) if a >= lo and b <= hi]
    assert pairs, "the workers' steps never overlap"
    counts = [
        np.searchsorted(ends, b, "right") - np.searchsorted(ends, a, "right") for a, b in pairs
    ]
    return float(np.mean(counts))


def _steps_with_timers(name: str, run: Path) -> pl.DataFrame:
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    ours = steps.select(
        pl.col(S.RANK).cast(pl.Int64),
        pl.col(S.STEP).cast(pl.Int64),
        (pl.col(S.WALL_NS) / 1e6).alias("step_tv"),
        (pl.col(S.COMM_TOTAL_NS) / 1e6).alias("comm_tv"),
    )
    timed = _timers(run, run.parent / "out")
    timers = timed.select(
        pl.col("rank").cast(pl.Int64).alias(S.RANK),
        pl.col("step").cast(pl.Int64).alias(S.STEP),
        "step_ms",
        "comm_ms",
        "forward_ms",
        *[c for c in ("push_ms", "pull_ms") if c in timed.columns],
    )
    return ours.join(timers, on=[S.RANK, S.STEP], how="inner")


def test_roles_and_architecture(ps_run: tuple[str, Path, dict[str, Any]]) -> None:
    name, _run, report = ps_run
    kvstore, update, _, workers, servers = SCENARIOS[name]
    assert report["run"]["architecture"] == "parameter_server"
    assert report["run"]["synchronous"] is (kvstore == "dist_sync")
    assert "collect" in report["run"]["architecture_from"]
    assert [r["role"] for r in report["ranks"]] == ["worker"] * workers
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(workers))
    # every server profiled through worker 0's KVStore, read as a server, numbered after
    assert [s["role"] for s in report["servers"]] == ["server"] * servers
    assert sorted(s["rank"] for s in report["servers"]) == list(range(workers, workers + servers))
    if update == "server":  # the optimizer runs there
        assert sum(s["updates"] for s in report["servers"]) > 0
    if kvstore == "dist_sync":  # a synchronous server sums the workers' pushes of a key
        assert sum(s["sums"] for s in report["servers"]) > 0
    else:
        assert sum(s["sums"] for s in report["servers"]) == 0
    for server in report["servers"]:
        assert 0 < server["busy_fraction"] < 1 and not server["bottleneck"]
    # a server has no steps: never a rank that did not finish, never a rank without steps
    assert report["incomplete_steps"] == []
    said = " ".join(report["warnings"])
    assert "no step window" not in said and "did not finish" not in said
    for rank in report["ranks"]:
        assert 0 < rank["busy_fraction"] <= 1


def test_each_workers_step_matches_its_timers(ps_run: tuple[str, Path, dict[str, Any]]) -> None:
    """Each worker's mean step over the profiled steps within 10% of its timers, and each step
    within 15% (2 loaded cores)."""
    name, run, _ = ps_run
    df = _steps_with_timers(name, run)
    assert df[S.RANK].n_unique() == SCENARIOS[name][3] and df.height >= 8
    error = (df["step_tv"] - df["step_ms"]).abs()
    bad = df.filter(error > (0.15 * df["step_ms"]).clip(lower_bound=2.0))
    assert bad.height <= 1, bad  # (one step preempted on the loaded cores)
    means = df.group_by(S.RANK).agg(pl.col("step_tv").mean(), pl.col("step_ms").mean())
    for rank, ours, timer in means.select(S.RANK, "step_tv", "step_ms").iter_rows():
        assert abs(ours - timer) <= max(1.0, 0.10 * timer), (name, rank, ours, timer)


def test_sync_wait_and_async_none(ps_run: tuple[str, Path, dict[str, Any]]) -> None:
    """Synchronous: the fast worker waits for the slow one in its push (the server answers
    once every worker's push of a key is in): its wait is what its push-pull takes beyond the
    slow worker's, by the timers, within 15%. Asynchronous: nobody waits, no wait is reported,
    and the cause is the slow worker's forward, not a wait."""
    name, run, report = ps_run
    ranks = {r["rank"]: r for r in report["ranks"]}
    fast = 1 - SLOW_RANK
    cause = report["summary"]["cause"]
    if SCENARIOS[name][0] == "dist_async":
        assert ranks[fast]["comm_wait_ms"] in (None, 0.0)
        assert report["summary"]["comm_wait_ms"] in (None, 0.0)
        assert report["collectives"] == []
        assert cause is not None and cause["rank"] == SLOW_RANK and cause["phase"] == S.FORWARD
        assert "wait" not in cause["kind"] and cause["kind"] == "compute"
        # the fast worker steps faster: throughput, not lockstep
        df = _steps_with_timers(name, run)
        mean = df.group_by(S.RANK).agg(pl.col("step_ms").mean())
        by = dict(mean.iter_rows())
        assert by[SLOW_RANK] > 1.5 * by[fast]
        # steps per second as the timers count them (from the starts of the profiled steps: the
        # timers' mean over the same steps)
        for rank, timer_ms in by.items():
            rate = ranks[rank]["steps_per_s"]
            assert abs(rate - 1e3 / timer_ms) <= 0.15 * 1e3 / timer_ms, (rank, rate, timer_ms)
        # the updates the slow worker did not see, counted from the timers' step ends (the fast
        # worker's between two of the slow one's, where both ran): not the ratio of their mean
        # steps, which the fast worker's steps, slower while the slow one computes, make smaller
        expected = _missed_updates(_timers(run, run.parent / "out"), SLOW_RANK, fast)
        assert abs(ranks[SLOW_RANK]["staleness"] - expected) <= 0.15 * expected + 0.2, (
            ranks[SLOW_RANK]["staleness"],
            expected,
        )
        assert ranks[fast]["staleness"] < 1.0
        return
    assert all(r["staleness"] is None for r in report["ranks"])  # (lockstep: none)
    df = _steps_with_timers(name, run)
    comm = dict(df.group_by(S.RANK).agg(pl.col("comm_ms").mean()).iter_rows())
    expected = comm[fast] - comm[SLOW_RANK]  # what the fast worker's push-pull waits
    assert expected > SLOW_MS * 0.6, comm  # (the workload's premise)
    wait = ranks[fast]["comm_wait_ms"]
    assert wait is not None and abs(wait - expected) <= max(2.0, 0.15 * expected), (wait, expected)
    assert (ranks[SLOW_RANK]["comm_wait_ms"] or 0.0) < 0.2 * expected
    summary = report["summary"]
    assert summary["straggler_rank"] == SLOW_RANK and summary["straggler_significant"]
    assert summary["straggler_phase"] == S.FORWARD
    if SCENARIOS[name][2] == "push-pull":
        # Every gradient pushed and waited for, then every weight pulled: the timers put the
        # wait in the pushes (a synchronous server answers a push once every worker's is in),
        # and so does the report, by the calls it matched (the pulls wait next to nothing).
        split = dict(
            df.group_by(S.RANK).agg(pl.col("push_ms").mean()).iter_rows()
        )  # fmt: skip
        in_push = split[fast] - split[SLOW_RANK]
        by_op = {c["op"]: c for c in report["collectives"]}
        pushed = by_op["push"]["wait_ms"] * 2  # (the mean over both workers: the fast one's all)
        assert abs(pushed - in_push) <= max(2.0, 0.15 * in_push), (pushed, in_push)
        assert by_op["pull"]["wait_ms"] * 2 < 0.1 * in_push, by_op["pull"]
    if SCENARIOS[name][1] == "worker":
        # A known gap: where the workers update, the slow worker's pulls do not all match the
        # fast one's (MXNet issues them differently), so the critical path is incomplete and
        # names no cause; the straggler above is the median-based one.
        return
    assert cause is not None and cause["rank"] == SLOW_RANK and cause["phase"] == S.FORWARD


def test_traces_alone_tell_the_roles_and_synchrony(
    ps_run: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    """The same job's traces read on their own (no status, no manifest): the roles from what
    each trace runs, synchrony from the servers' sums; a server's trace alone, and the
    workers' alone, read as far as they go with one warning naming the missing role."""
    name, run, _ = ps_run
    kvstore, _, _, workers, servers = SCENARIOS[name]
    both, alone, without = tmp_path / "both", tmp_path / "server", tmp_path / "workers"
    for folder in (both, alone, without):
        folder.mkdir()
    for trace in sorted((run / "raw").glob("rank-*/rank-*.mxnet.json.gz")):
        shutil.copy(trace, both / trace.name)
        shutil.copy(trace, without / trace.name)
    for i, trace in enumerate(sorted((run / "raw").glob("server-*/rank*_traceview-server.json"))):
        shutil.copy(trace, both / f"server{i}.json")
        shutil.copy(trace, alone / f"server{i}.json")
    report = run_cli("report", both, "--json").json()
    assert report["run"]["architecture"] == "parameter_server"
    assert report["run"]["synchronous"] is (kvstore == "dist_sync")
    assert "trace" in report["run"]["architecture_from"]
    assert len(report["ranks"]) == workers and len(report["servers"]) == servers
    assert report["incomplete_steps"] == []
    served = run_cli("report", alone, "--json").json()
    assert [s["role"] for s in served["servers"]] == ["server"] * servers
    assert served["ranks"] == [] and any("without a worker" in w for w in served["warnings"])
    pushed = run_cli("report", without, "--json").json()
    assert [r["role"] for r in pushed["ranks"]] == ["worker"] * workers
    assert any("without a server" in w for w in pushed["warnings"])


def test_compare_sets_sync_and_async_side_by_side(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``compare`` of the synchronous and the asynchronous job: per worker step time,
    throughput, wait and staleness, and the runs' throughputs (worker steps per second, summed)
    as the timers count them."""
    _, sync, _ = _ps_run("sync", tmp_path_factory)
    _, unsync, _ = _ps_run("async", tmp_path_factory)
    result = run_cli("compare", sync, unsync, "--json").json()
    runs = {r["architecture"] + str(r["synchronous"]): r for r in result["runs"]}
    assert set(runs) == {"parameter_serverTrue", "parameter_serverFalse"}
    for name, run, path in (  # (the timers over the profiled steps)
        ("sync", runs["parameter_serverTrue"], sync),
        ("async", runs["parameter_serverFalse"], unsync),
    ):
        timers = _steps_with_timers(name, path)
        rates = timers.group_by(S.RANK).agg((1e3 / pl.col("step_ms").mean()).alias("rate"))
        expected = float(rates["rate"].sum())
        assert abs(run["worker_steps_per_s"] - expected) <= 0.15 * expected, (run, expected)
        assert [w["rank"] for w in run["workers"]] == [0, 1]
    assert all(w["staleness"] is None for w in runs["parameter_serverTrue"]["workers"])
    assert all(w["staleness"] is not None for w in runs["parameter_serverFalse"]["workers"])
    assert runs["parameter_serverFalse"]["workers"][1 - SLOW_RANK]["comm_wait_ms"] is None
    assert runs["parameter_serverTrue"]["workers"][1 - SLOW_RANK]["comm_wait_ms"] > SLOW_MS / 2
    # asynchronous: the fast worker is not held back, so the job trains faster
    assert any("worker steps per second" in h for h in result["highlights"])
    assert (
        runs["parameter_serverFalse"]["worker_steps_per_s"]
        > runs["parameter_serverTrue"]["worker_steps_per_s"]
    )
    text = run_cli("compare", sync, unsync).out
    assert "Per worker" in text and "async PS" in text
