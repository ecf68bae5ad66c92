"""traceview-dmlc: run an MXNet parameter-server (ps-lite KVStore) job on this machine.

    traceview-dmlc -n 2 -s 1 python train.py --kv-store dist_sync
    traceview collect -- traceview-dmlc -n 2 -s 1 python train.py --kv-store dist_sync

Starts one scheduler, S servers and N workers, each running COMMAND with the variables ps-lite
reads: DMLC_ROLE, DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT (the scheduler), DMLC_NUM_SERVER,
DMLC_NUM_WORKER, DMLC_NODE_HOST, plus DMLC_TASK_ID (workers 0..N-1, then the servers), as
MXNet's ``tools/launch.py --launcher local`` does, except that everything listens on 127.0.0.1
(ps-lite otherwise picks the first non-loopback interface). The exit code is the first failing
worker's, else the first failing server's or scheduler's, else 0. Signals are passed on to every
process; when a worker fails, the others are stopped.

Standard library only: it runs as the job's launcher, in whatever Python starts it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LOOPBACK = "127.0.0.1"
SHUTDOWN_GRACE_S = 30.0  # servers and scheduler leave once the workers have finished


@dataclass
class Role:
    role: str
    task_id: int | None
    process: subprocess.Popen[bytes]

    @property
    def label(self) -> str:
        return self.role if self.task_id is None else f"{self.role} {self.task_id}"


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def role_environment(
    base: dict[str, str], role: str, workers: int, servers: int, port: int, task_id: int | None
) -> dict[str, str]:
    env = dict(base)
    env.update(
        DMLC_ROLE=role,
        DMLC_PS_ROOT_URI=LOOPBACK,
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NUM_WORKER=str(workers),
        DMLC_NUM_SERVER=str(servers),
        DMLC_NODE_HOST=LOOPBACK,
    )
    if task_id is not None:
        env["DMLC_TASK_ID"] = str(task_id)
    else:
        env.pop("DMLC_TASK_ID", None)
    return env


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="traceview-dmlc",
        description="Run an MXNet parameter-server job (scheduler, servers, workers) on this "
        "machine, on 127.0.0.1.",
    )
    parser.add_argument("-n", "--num-workers", type=int, required=True, help="worker processes")
    parser.add_argument(
        "-s",
        "--num-servers",
        type=int,
        default=None,
        help="server processes (default: as many as workers)",
    )
    parser.add_argument("--port", type=int, default=0, help="scheduler port (default: a free one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every process runs")
    args = parser.parse_args(list(argv))
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the command to run, e.g. traceview-dmlc -n 2 -s 1 python train.py")
    if args.num_workers < 1 or (args.num_servers is not None and args.num_servers < 1):
        parser.error("at least one worker and one server")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    workers = args.num_workers
    servers = args.num_servers if args.num_servers is not None else workers
    port = args.port or free_port()
    base = dict(os.environ)
    plan: list[tuple[str, int | None]] = [("scheduler", None)]
    plan += [("server", workers + i) for i in range(servers)]
    plan += [("worker", i) for i in range(workers)]
    procs: list[Role] = []
    try:
        for role, task_id in plan:
            env = role_environment(base, role, workers, servers, port, task_id)
            procs.append(Role(role, task_id, subprocess.Popen(args.command, env=env)))
    except OSError as exc:
        print(
            f"traceview-dmlc: cannot run {args.command[0]}: {exc.strerror or exc}", file=sys.stderr
        )
        _stop(procs)
        return 127

    def forward(signum: int, frame: Any) -> None:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.process.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, forward)
    return _wait(procs)


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _failed(procs: list[Role]) -> Role | None:
    return next((p for p in procs if p.process.poll() not in (None, 0)), None)


def _wait(procs: list[Role]) -> int:
    workers = [p for p in procs if p.role == "worker"]
    failed = _failed(procs)
    while failed is None and any(p.process.poll() is None for p in workers):
        time.sleep(0.05)
        failed = _failed(procs)
    if failed is None:  # the workers are done: the servers and the scheduler follow
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while any(p.process.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
    leftover = [p for p in procs if p.process.poll() is None]
    if failed is not None:
        code = _code(failed.process.returncode)
        print(
            f"traceview-dmlc: {failed.label} exited with code {code}; stopping the others",
            file=sys.stderr,
        )
    elif leftover:
        names = ", ".join(p.label for p in leftover)
        print(
            f"traceview-dmlc: {names} still running after the workers ended; stopping",
            file=sys.stderr,
        )
    _stop(procs)
    if failed is not None:
        return _code(failed.process.returncode or 1)
    codes = [(p, _code(p.process.returncode or 0)) for p in procs]
    for proc, code in codes:
        if proc.role == "worker" and code != 0:
            return code
    return next((code for _, code in codes if code not in (0, 128 + signal.SIGTERM)), 0)


def _stop(procs: list[Role], grace: float = 5.0) -> None:
    for proc in procs:
        if proc.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.process.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        if proc.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.process.kill()
            proc.process.wait()


if __name__ == "__main__":
    sys.exit(main())
