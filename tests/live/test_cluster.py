"""Ingest on a real Dask distributed cluster (`dask scheduler` and `dask worker` processes on
127.0.0.1): the same run as a local ingest, the worker of each rank recorded, a worker killed
mid-ingest costs nothing, an unreachable scheduler is one line (issue 15)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLES, run_cli

pytest.importorskip("distributed", reason="Dask is an optional extra: pip install traceview[dask]")

JOB = SAMPLES / "pytorch" / "slowfwd"  # 3 ranks


@dataclass
class Cluster:
    scheduler_file: Path
    address: str
    workers: list[subprocess.Popen] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)


def _dask(*args: str, env: dict[str, str] | None = None, log: Path) -> subprocess.Popen:
    dask = Path(sys.executable).with_name("dask")
    return subprocess.Popen(
        [str(dask), *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        start_new_session=True,
    )


def _wait_for(cluster: Cluster, workers: int, timeout: float = 60) -> None:
    from distributed import Client

    deadline = time.monotonic() + timeout
    while not cluster.scheduler_file.exists():
        assert time.monotonic() < deadline, "the scheduler did not start"
        time.sleep(0.2)
    cluster.address = json.loads(cluster.scheduler_file.read_text())["address"]
    with Client(cluster.address, timeout=30) as client:
        client.wait_for_workers(workers, timeout=timeout)


def _start(tmp: Path, worker_envs: list[dict[str, str]], nanny: bool = True) -> Cluster:
    cluster = Cluster(tmp / "scheduler.json", "")
    cluster.processes.append(
        _dask(
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            str(cluster.scheduler_file),
            log=tmp / "scheduler.log",
        )
    )
    for i, env in enumerate(worker_envs):
        worker = _dask(
            "worker",
            "--scheduler-file",
            str(cluster.scheduler_file),
            "--nthreads",
            "1",
            "--no-dashboard",
            *([] if nanny else ["--no-nanny"]),
            env=env,
            log=tmp / f"worker-{i}.log",
        )
        cluster.workers.append(worker)
        cluster.processes.append(worker)
    _wait_for(cluster, len(worker_envs))
    return cluster


def _stop(cluster: Cluster) -> None:
    for proc in reversed(cluster.processes):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in cluster.processes:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = _start(tmp_path_factory.mktemp("cluster"), [{}, {}])
    yield running
    _stop(running)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("local") / "run"
    assert run_cli("ingest", JOB, "-o", out).code == 0
    return run_cli("report", "--json", out).json()


def _same_report(a: dict, b: dict) -> None:
    for key in ("summary", "ranks", "per_step", "top_ops", "collectives", "warnings"):
        assert a[key] == b[key], key


def test_a_cluster_ingest_is_the_local_ingest(
    cluster: Cluster, local: dict, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    result = run_cli("ingest", JOB, "--scheduler-file", cluster.scheduler_file, "-o", out)
    assert result.code == 0, result.err
    assert "on 2 Dask worker(s)" in result.out or "on 1 Dask worker(s)" in result.out
    _same_report(run_cli("report", "--json", out).json(), local)
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(r["worker"].startswith("tcp://127.0.0.1:") for r in manifest["ranks"])
    assert not list(out.rglob("*.tmp"))


def test_the_scheduler_from_the_environment(cluster: Cluster, local: dict, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli("ingest", JOB, "-o", out, env={"TRACEVIEW_SCHEDULER": cluster.address})
    assert result.code == 0, result.err
    _same_report(run_cli("report", "--json", out).json(), local)


def test_a_bad_trace_on_the_cluster_costs_only_its_rank(cluster: Cluster, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(JOB, folder)
    (folder / "rank-2.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 8)
    result = run_cli("report", "--json", folder)  # locally, for the reference
    cluster_out = tmp_path / "run"
    on_cluster = run_cli("ingest", folder, "--scheduler", cluster.address, "-o", cluster_out)
    assert on_cluster.code == 0, on_cluster.err
    assert "rank-2.pt.trace.json.gz" in on_cluster.err
    _same_report(run_cli("report", "--json", cluster_out).json(), result.json())


def test_a_worker_killed_mid_ingest_loses_nothing(local: dict, tmp_path: Path) -> None:
    """One worker dies (SIGKILL, no nanny to restart it) as it starts its first rank; Dask gives
    that rank to the other worker and the run completes, equal to the local one."""
    doomed_env = {"TRACEVIEW_FAULT": "ingest:rank"}
    running = _start(tmp_path, [doomed_env, {}], nanny=False)
    try:
        out = tmp_path / "run"
        result = run_cli("ingest", JOB, "--scheduler-file", running.scheduler_file, "-o", out)
        assert result.code == 0, result.err
        doomed = running.workers[0]
        assert doomed.wait(timeout=30) == -signal.SIGKILL, "the doomed worker took no rank"
        _same_report(run_cli("report", "--json", out).json(), local)
        manifest = json.loads((out / "manifest.json").read_text())
        assert len({r["worker"] for r in manifest["ranks"]}) == 1  # the survivor did them all
    finally:
        _stop(running)


def test_an_unreachable_scheduler_is_one_line(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_cli("ingest", JOB, "--scheduler", "tcp://127.0.0.1:9", "-o", tmp_path / "run")
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in result.err
    assert time.monotonic() - started < 60
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content", [None, b"{}", b"\xff\x00garbage", b"[1, 2]"])
def test_a_bad_scheduler_file_is_one_line(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "scheduler.json"
    if content is not None:
        path.write_bytes(content)
    result = run_cli("ingest", JOB, "--scheduler-file", path, "-o", tmp_path / "run")
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert "scheduler file" in result.err and str(path) in result.err
