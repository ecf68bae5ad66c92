"""What `traceview collect` runs in the tasks of a TensorFlow parameter-server job
(``ParameterServerStrategy`` with a ``ClusterCoordinator``; standard library only).

Every task is a process of its own with its ``TF_CONFIG``. Workers and parameter servers run
no Python of the job's once their ``tf.distribute.Server`` joins: each starts TensorFlow's
profiler service on a free port when the job imports tensorflow, records the port in
``RUN/raw/.tf-services/<type>-<index>.json``, and its status in its folder (a worker's is its
rank's, ``raw/rank-NNNNN``; a parameter server's ``raw/ps-N``). The chief runs the job: its steps
are the closures its coordinator hands the workers, counted as they complete (a hook on the
coordinator's ``Closure.execute_on``). After ``--skip`` closures it profiles itself and, through
their services, every other task for as long as ``--warmup`` + ``--steps`` closures took so far
(the remote trace is given its duration up front), stops its own profile once those closures
completed, and at exit waits for the remote trace and moves each task's XSpace into that task's
folder, its own into ``raw/chief-N``. The traces carry the roles too (``parsers/tf_roles.py``).

A worker or server serves inside TensorFlow's C++ until the job ends it (SIGTERM, its normal
end): no Python handler could run there, and one installed would keep the signal from ending it.
The chief writes their final status once their profiles are in place (state "ok", the trace).
As everywhere in the rank-side code, a failure prints one ``traceview:`` line and the job runs on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from .rankside import Config, Status, install_exit_handlers, rank_dir, warn

SERVICES = ".tf-services"
ROLES = {"chief": "chief", "worker": "worker", "ps": "ps"}
#: The remote trace's length: this many times what the window's closures would take one after
#: another at the pace of those before it (so that each worker runs about as many, the slowest
#: too), within these bounds (seconds).
MARGIN, SHORTEST, LONGEST = 1.5, 2.0, 60.0


def parameter_server_task(value: str | None) -> tuple[str, int, dict[str, Any]] | None:
    """(task type, index, cluster) of a task of a parameter-server job from its TF_CONFIG; None
    where the cluster has no parameter server or the task is none of chief, worker, ps."""
    try:
        config = json.loads(value) if value else None
        cluster, task = config["cluster"], config["task"]  # type: ignore[index]
        kind, index = str(task["type"]), int(task.get("index", 0))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not isinstance(cluster, dict) or not cluster.get("ps") or kind not in ROLES:
        return None
    return kind, index, cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Serving:
    """A worker or parameter server: its profiler service, its status."""

    def __init__(self, config: Config, tf: Any, kind: str, index: int, cluster: dict[str, Any]):
        workers = len(cluster.get("worker") or [])
        raw = Path(config.run_dir) / "raw"
        if kind == "worker":
            self.folder, rank = rank_dir(Path(config.run_dir), index), index
        else:
            self.folder, rank = raw / f"{kind}-{index}", -1
        self.status = Status(rank, max(workers, 1), 0, "TF_CONFIG")
        self.status.role = ROLES[kind]
        self.status.framework, self.status.framework_version = "tensorflow", str(tf.__version__)
        port = _free_port()
        tf.profiler.experimental.server.start(port)
        self.status.notes.append(
            f"TensorFlow parameter-server {kind} {index}: profiled by the chief through its "
            f"profiler service (port {port})"
        )
        self.status.write_to(self.folder)
        registry = raw / SERVICES
        registry.mkdir(parents=True, exist_ok=True)
        entry = {"type": kind, "index": index, "port": port, "folder": self.folder.name}
        tmp = registry / f".{kind}-{index}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, registry / f"{kind}-{index}.json")


#: A serving task's end as the chief records it.
SERVED = "served until the job ended it, as a parameter-server task does"


def _served(folder: Path) -> None:
    """A worker's or server's status once the chief placed its profile in ``folder``."""
    path = folder / "status.json"
    status = json.loads(path.read_text())
    status["trace_files"] = sorted(p.name for p in folder.glob("*.xplane.pb"))
    status["state"], status["detail"] = "ok", SERVED
    tmp = folder / f".status.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(status, indent=2))
    os.replace(tmp, path)


class _Chief:
    """The coordinator: its closures counted as they complete, the window's profiles."""

    def __init__(self, config: Config, tf: Any, index: int, cluster: dict[str, Any]):
        self.config, self.tf = config, tf
        self.raw = Path(config.run_dir) / "raw"
        self.folder = self.raw / f"chief-{index}"
        self.workers = max(len(cluster.get("worker") or []), 1)
        self.status = Status(-1, self.workers, 0, "TF_CONFIG")
        self.status.role = "chief"
        self.status.framework, self.status.framework_version = "tensorflow", str(tf.__version__)
        self.lock = threading.Lock()
        self.completed = 0
        self.seconds = 0.0  # the closures' time before the window
        self.profiling = self.finished = self.failed = False
        self.remote: threading.Thread | None = None
        self.logdir = self.folder / ".tfprofile"
        self.status.write_to(self.folder)
        self._hook()

    def _hook(self) -> None:
        from tensorflow.python.distribute.coordinator import cluster_coordinator

        chief, original = self, cluster_coordinator.Closure.execute_on

        def execute_on(closure: Any, worker: Any) -> Any:
            began = time.perf_counter()
            result = original(closure, worker)
            chief.completed_one(time.perf_counter() - began)
            return result

        cluster_coordinator.Closure.execute_on = execute_on

    def completed_one(self, seconds: float) -> None:
        """A closure completed on a worker (on the coordinator's thread for that worker)."""
        with self.lock:
            if self.finished or self.failed:
                return
            self.completed += 1
            window, skip = self.config.warmup + self.config.active, max(self.config.skip, 1)
            try:
                if self.completed == skip:
                    self.seconds += seconds
                    self._start(self.seconds / self.completed * window)
                elif self.completed < skip:
                    self.seconds += seconds
                elif self.completed >= skip + window and self.remote is None:
                    self._stop()  # (no other task to trace: the window's closures done)
            except Exception as exc:
                self.failed = True
                warn(f"could not profile the parameter-server job ({type(exc).__name__}: {exc})")

    def _start(self, expected_s: float) -> None:
        services = self._services()
        addresses = ",".join(f"grpc://127.0.0.1:{s['port']}" for s in services)
        duration = min(max(expected_s * MARGIN, SHORTEST), LONGEST)
        if addresses:
            self.remote = threading.Thread(
                target=self._trace_remote, args=(addresses, int(duration * 1000)), daemon=True
            )
            self.remote.start()
        self.tf.profiler.experimental.start(str(self.logdir / "chief"))
        self.profiling = True
        self.status.state = "profiling"
        self.status.notes.append(
            f"profiled from closure {self.completed}; the other tasks for {duration:.1f} s"
        )
        self.status.write_to(self.folder)

    def _trace_remote(self, addresses: str, ms: int) -> None:
        """The other tasks' profiles, then the chief's own stops: one window for all."""
        try:
            self.tf.profiler.experimental.client.trace(addresses, str(self.logdir / "tasks"), ms)
        except Exception as exc:
            self.status.notes.append(f"the other tasks' profiles failed: {exc}")
        with self.lock, contextlib.suppress(Exception):
            self._stop()

    def _stop(self) -> None:
        if self.profiling:
            self.profiling = False
            self.tf.profiler.experimental.stop()

    def _services(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted((self.raw / SERVICES).glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                entry = json.loads(path.read_text())
                if isinstance(entry.get("port"), int) and isinstance(entry.get("folder"), str):
                    found.append(entry)
        return found

    def finish(self, state: str | None = None, detail: str | None = None) -> None:
        with self.lock:
            if self.finished or state is None:
                return
            self.finished = True
        try:
            if self.remote is not None:
                self.remote.join(LONGEST + 30)
            with self.lock:
                self._stop()
            self._place()
        except Exception as exc:
            warn(f"could not write the parameter-server job's profiles ({exc})")
        self.status.state, self.status.detail = state, detail
        self.status.ended_ns = time.time_ns()
        with contextlib.suppress(OSError):
            self.status.trace_files = sorted(p.name for p in self.folder.glob("*.xplane.pb"))
        with contextlib.suppress(Exception):
            self.status.write_to(self.folder)

    def _place(self) -> None:
        """Each XSpace into its task's folder (the others' are named ``<host>_<port>``)."""
        folders = {s["port"]: s["folder"] for s in self._services()}
        for written in sorted(self.logdir.glob("*/plugins/profile/*/*.xplane.pb")):
            if written.parts[-5] == "chief":
                target = self.folder / f"{socket.gethostname()}.xplane.pb"
            else:
                port = written.name[: -len(".xplane.pb")].rpartition("_")[2]
                folder = folders.get(int(port)) if port.isdigit() else None
                if folder is None or "/" in folder or folder.startswith("."):
                    continue
                target = self.raw / folder / written.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(written, target)
        shutil.rmtree(self.logdir, ignore_errors=True)
        for folder in sorted({self.raw / f for f in folders.values()} - {self.folder}):
            with contextlib.suppress(OSError, ValueError):
                _served(folder)


def start_task(config: Config, tf: Any, kind: str, index: int, cluster: dict[str, Any]) -> None:
    """Set up the task once the job has imported tensorflow (never breaking the job)."""
    try:
        if kind == "chief":
            install_exit_handlers(_Chief(config, tf, index, cluster))
        else:
            _Serving(config, tf, kind, index, cluster)
    except Exception as exc:
        warn(f"could not profile this {kind} ({type(exc).__name__}: {exc}); running unprofiled")
