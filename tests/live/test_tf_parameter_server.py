"""TensorFlow's parameter-server strategy read as what it is, from its profiles alone: a real
job (``ParameterServerStrategy`` with a ``ClusterCoordinator``: a chief, two workers and one or
two parameter servers, each its own process on 127.0.0.1; tests/workloads/ps/tf_ps.py), worker 1
slowed by about 60 ms of matrix products a step, every task profiled (the chief itself, the
others through TensorFlow's profiler service). The profiles' names say nothing of the roles.

The job's own record (timers.json): which worker ran each closure (a file in the worker's own
directory, read inside the step), and the step's start and the return of the server's answer on
that worker (``tf.timestamp`` inside the step). None of the expectations comes from traceview.

What would fail if the reading were wrong: the chief or a server counted as a worker (they run
no steps); steps per worker not what the coordinator handed each; a worker's step away from its
timers; a wait across workers (nobody waits: the coordinator hands each step to a free worker);
the variables' reads from the server not counted as communication; "forward" or a straggler as
the verdict where the workers idle between closures; the fast worker's idling not seen.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import REPO, run_cli

pytest.importorskip("tensorflow", reason="pip install tensorflow-cpu")
pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof: pip install '.[tensorflow]'")

WORKLOAD = REPO / "tests" / "workloads" / "ps" / "tf_ps.py"
SLOW = 1

#: name -> parameter servers
SCENARIOS = {"1ps": 1, "2ps": 2}
_RUNS: dict[str, tuple[Path, dict[str, Any], list[dict[str, Any]]]] = {}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def tf_ps(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    name = request.param
    if name not in _RUNS:
        out = tmp_path_factory.mktemp(f"tfps-{name}")
        command = [
            sys.executable, str(WORKLOAD), str(out), "--workers", "2",
            "--ps", str(SCENARIOS[name]), "--slow-worker", str(SLOW), "--slow-ms", "60",
            "--batch", "256", "--width", "2048", "--steps", "40",
        ]  # fmt: skip
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        result = run_cli("report", out / "profile", "--json", "--skip", "0")
        assert result.code == 0, result.err
        timers = json.loads((out / "timers.json").read_text())
        _RUNS[name] = out, result.json(), timers
    return _RUNS[name]


def _workers(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in report["ranks"]}


def _by_worker(report: dict[str, Any], timers: list[dict[str, Any]]) -> dict[int, int]:
    """Which rank is which worker: the worker that ran as many closures (the slow one runs
    fewer: 40 closures, the fast one takes most)."""
    ran = collections.Counter(t["worker"] for t in timers)
    assert ran[SLOW] < ran[1 - SLOW], ran
    ranks = _workers(report)
    by_steps = {r["steps_run"]: rank for rank, r in ranks.items()}
    assert sorted(by_steps) == sorted(ran.values()), (by_steps, ran)
    return {worker: by_steps[n] for worker, n in ran.items()}


def test_roles_and_synchrony_from_the_profiles_alone(tf_ps: Any) -> None:
    out, report, _ = tf_ps
    run = report["run"]
    assert run["architecture"] == "parameter_server"
    assert run["synchronous"] is False
    assert "trace" in run["architecture_from"] and "coordinator" in run["architecture_from"]
    assert sorted(r["role"] for r in report["ranks"]) == ["worker", "worker"]
    roles = collections.Counter(s["role"] for s in report["servers"])
    assert roles == {"chief": 1, "server": len(list((out / "tasks").glob("ps-*")))}
    chief = next(s for s in report["servers"] if s["role"] == "chief")
    assert chief["dispatched"] == 40
    for server in report["servers"]:
        if server["role"] == "server":
            assert server["updates"] > 0 and server["busy_fraction"] is not None
    # a server or the coordinator is never a rank that did not finish or has no steps
    assert not report["incomplete_steps"]
    assert not any("no step window" in w for w in report["warnings"]), report["warnings"]


def test_each_worker_ran_the_steps_the_coordinator_handed_it(tf_ps: Any) -> None:
    _, report, timers = tf_ps
    which = _by_worker(report, timers)
    ranks = _workers(report)
    ran = collections.Counter(t["worker"] for t in timers)
    for worker, rank in which.items():
        assert ranks[rank]["steps_run"] == ran[worker]


def test_each_workers_step_matches_its_timers(tf_ps: Any) -> None:
    """Each worker's mean step (every step counted: --skip 0) within 10% of its timers', from
    the step's start to the server's answer back on the worker."""
    _, report, timers = tf_ps
    which = _by_worker(report, timers)
    ranks = _workers(report)
    for worker, rank in which.items():
        timed = [(t["t1_us"] - t["t0_us"]) / 1e3 for t in timers if t["worker"] == worker]
        print(f"worker {worker} (rank {rank}): {ranks[rank]['step_ms']} ms, timers "
              f"{statistics.mean(timed):.2f} ms")  # fmt: skip
        assert ranks[rank]["step_ms"] == pytest.approx(statistics.mean(timed), rel=0.10)
    assert ranks[which[SLOW]]["step_ms"] > 2 * ranks[which[1 - SLOW]]["step_ms"]


def test_no_wait_across_workers_and_the_server_reads_are_communication(tf_ps: Any) -> None:
    """Nobody waits for the slow worker: no wait, no straggler; each worker's reads of the
    variables on the servers (2048x256 and 2048x10 floats a step, 2 MB) are communication."""
    _, report, _ = tf_ps
    summary = report["summary"]
    assert summary["straggler_rank"] is None and summary["straggler_significant"] is False
    for rank in report["ranks"]:
        assert not rank["comm_wait_ms"], rank
        assert rank["comm_total_ms"] > 0.05 * rank["step_ms"], rank
        assert rank["straggler"] is False


def test_workers_idling_between_closures_is_the_verdict(tf_ps: Any) -> None:
    """The fast worker idles between the closures the coordinator hands it (the chief's
    dispatch of each on two shared cores): its busy fraction is what its timers leave between
    them, and the verdict is the dispatch, not a phase of the step."""
    _, report, timers = tf_ps
    which = _by_worker(report, timers)
    ranks = _workers(report)
    fast = sorted((t["t0_us"], t["t1_us"]) for t in timers if t["worker"] == 1 - SLOW)
    inside = sum(t1 - t0 for t0, t1 in fast)
    busy = inside / (fast[-1][1] - fast[0][0])
    print(
        f"fast worker busy: timers {busy:.2f}, traceview {ranks[which[1 - SLOW]]['busy_fraction']}"
    )
    assert ranks[which[1 - SLOW]]["busy_fraction"] == pytest.approx(busy, abs=0.10)
    cause = report["summary"]["cause"]
    if busy < 0.7:  # (on a machine where the coordinator keeps them busy, nothing to say)
        assert cause is not None and cause["kind"] == "dispatch", cause
        assert report["summary"]["bottleneck"] == "dispatch"
        chief = next(s for s in report["servers"] if s["role"] == "chief")
        assert cause["rank"] == chief["rank"]
    assert cause is None or cause["kind"] in ("dispatch", "server", "compute", "transfer", "io")


def test_a_job_missing_some_tasks_profiles_is_read_as_far_as_they_go(
    tf_ps: Any, tmp_path: Path
) -> None:
    """The chief's profile alone, and the workers' without the chief's and the servers': each
    read (exit 0), the missing roles named in one warning."""
    out, report, _ = tf_ps
    profiles = sorted((out / "profile").glob("*.xplane.pb"))
    chief = [p for p in profiles if p.name == "chief.xplane.pb"]
    workers = [
        p for p in profiles if p.name[: -len(".xplane.pb")] in {r["host"] for r in report["ranks"]}
    ]
    assert len(chief) == 1 and len(workers) == 2
    for name, chosen, missing in (
        ("chief", chief, "a server or a worker's"),
        ("workers", workers, "a server or a chief's"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        for path in chosen:
            (folder / path.name).symlink_to(path)
        result = run_cli("report", folder, "--json")
        assert result.code == 0, result.err
        warnings = [w for w in result.json()["warnings"] if "parameter-server job" in w]
        assert len(warnings) == 1 and missing in warnings[0], warnings


# --- under traceview collect: every task profiled, the roles from TF_CONFIG -------------------


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[Any]]:
    """The same job (120 closures, its own profiling off) under ``traceview collect``: the chief
    profiles itself and the workers' and server's profiler services over one window."""
    work = tmp_path_factory.mktemp("tfps-collect")
    out, run = work / "out", work / "run"
    command = [
        sys.executable, "-m", "traceview", "collect", "--no-report", "-o", str(run), "--",
        sys.executable, str(WORKLOAD), str(out), "--no-profile", "--workers", "2", "--ps", "1",
        "--slow-worker", str(SLOW), "--slow-ms", "60", "--batch", "256", "--width", "2048",
        "--steps", "120",
    ]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = run_cli("report", run, "--json", "--skip", "0")
    assert result.code == 0, result.err
    return run, result.json(), json.loads((out / "timers.json").read_text())


def test_collect_profiles_every_task_of_the_job(collected: Any) -> None:
    """Roles from collect (TF_CONFIG): the workers are ranks 0 and 1 (their task index), the
    chief and the parameter server are listed as what they are; every task ended ok and wrote
    its profile; the chief handed out about the steps the workers ran in the window."""
    run, report, _ = collected
    assert report["run"]["architecture"] == "parameter_server"
    assert report["run"]["synchronous"] is False
    assert report["run"]["architecture_from"].startswith("roles from collect")
    assert [(r["rank"], r["role"]) for r in report["ranks"]] == [(0, "worker"), (1, "worker")]
    assert sorted(s["role"] for s in report["servers"]) == ["chief", "server"]
    manifest = json.loads((run / "manifest.json").read_text())["collect"]
    every = [*manifest["ranks"], *manifest["processes"]]
    assert len(every) == 4 and all(p["state"] == "ok" and p["trace"] for p in every), every
    assert not [w for w in report["warnings"] if "ended" in w or "no trace" in w], report[
        "warnings"
    ]
    ran = sum(r["steps_run"] for r in report["ranks"])
    chief = next(s for s in report["servers"] if s["role"] == "chief")
    # (the chief counts what it handed out in its own profile's window, the workers what ran in
    # theirs; on two loaded cores the windows' edges differ by up to 12 of 75-97 steps, seen in
    # two full runs; alone, within 8)
    assert ran >= 10 and abs(chief["dispatched"] - ran) <= max(8, 0.2 * ran), (chief, ran)


def test_collected_workers_steps_match_their_timers(collected: Any) -> None:
    """Each worker's steps are the closures its timers say it ran inside its profile (one at
    either edge may be cut), and its mean step is within 10% of theirs over those closures (the
    profile's window is read from the run's steps table only to choose them)."""
    run, report, timers = collected
    steps = pl.read_parquet(run / "steps.parquet")
    for rank in report["ranks"]:
        worker = rank["rank"]  # (collect's rank is the worker's task index)
        mine = steps.filter(pl.col("rank") == worker)
        lo, hi = mine["start_ns"].min() / 1e3, mine["end_ns"].max() / 1e3
        inside = [
            (t["t1_us"] - t["t0_us"]) / 1e3
            for t in timers
            if t["worker"] == worker and lo - 2e3 <= t["t0_us"] and t["t1_us"] <= hi + 2e3
        ]
        print(f"worker {worker}: {rank['step_ms']} ms over {rank['steps_run']} steps; timers "
              f"{statistics.mean(inside):.2f} ms over {len(inside)} closures")  # fmt: skip
        assert rank["steps_run"] >= 3 and abs(len(inside) - rank["steps_run"]) <= 2, rank
        assert rank["step_ms"] == pytest.approx(statistics.mean(inside), rel=0.10)
