"""`traceview collect`'s MXNet side, in every process of the job (standard library only).

Loaded from the bootstrap package beside the runtime (``rankside.py``), which calls
``prepare`` at start-up and ``start`` once the job has imported ``mxnet``; the collector is a
``rankside_lifecycle.Collector``.

- Parameter-server jobs (ps-lite KVStore) run a scheduler, servers and workers, told apart by
  ``DMLC_ROLE``. A scheduler or server never gets past ``import mxnet`` (MXNet runs the server
  loop inside the import and exits), so ``prepare`` records it: its status goes to
  ``RUN/raw/<role>-<n>/status.json`` and is updated at exit. The servers are profiled through
  the KVStore: worker 0 starts their profilers with its own window and has them dump when it
  stops (``profile_process="server"``); a server writes ``rank<K>_`` + the file name into its
  working directory, which ``prepare`` makes its own folder right before ``import mxnet`` runs
  the server (the job's code before the import ran where it was started; none runs after).
- A worker (or a process without a role) is profiled from a hook on ``gluon.Trainer.step`` (and
  ``Trainer.update``, ``Module.update``), or from ``traceview.collectors.step()`` once the script
  calls it: after ``--skip`` + ``--warmup`` steps it waits for the
  engine, starts ``mx.profiler`` (profile_all), marks each of the next ``--steps`` steps as an
  ``mx.profiler.Task`` named ``step#N`` in the ``traceview`` domain, waits for the engine again
  and writes ``RUN/raw/rank-NNNNN/rank-N.mxnet.json.gz``. Data loading (Gluon DataLoader,
  ``mx.io.DataIter``) is marked as ``DataLoader.next``/``DataIter.next`` Tasks.
- The rank is the KVStore's (``kv.rank``) for distributed KVStores, else ``DMLC_TASK_ID`` for a
  worker that has one, else the launcher's (the runtime's ``detect_rank``).
- Bulk execution is left as the job has it (on by default): the profiler does not change how
  the job runs. Backward then shows as ``ImperativeBulk`` segments, which the engine layout
  (traceview/normalize/mxnet_engine.py) counts as backward; docs/mxnet.md says what that costs.

Nothing here may break the job: a failure prints one ``traceview:`` line and the job runs on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .rankside import (
    AfterImport,
    Config,
    MemoryCap,
    RankInfo,
    Status,
    detect_rank,
    install_exit_handlers,
    rank_dir,
    sample_resident,
    warn,
    write_gzip,
)
from .rankside_lifecycle import PacedCollector, every_subclass, mark_calls, replace
from .rankside_record import ASYNC, IO_PHASE, StepRecord

ROLE_VARIABLE = "DMLC_ROLE"
SERVER_ROLES = ("scheduler", "server")
#: The name a server's profile is asked for (it writes rank<K>_<name> in its folder).
SERVER_TRACE = "traceview-server.json"
DOMAIN = "traceview"
TRACE_SUFFIX = ".mxnet.json.gz"
TRACE_GZIP_LEVEL = 6

_collector: MXNetCollector | None = None
#: Seconds the profiler runs on after the last recorded step, waiting for the next step to stop
#: it there (so that the job's timing of its last recorded step does not see the stop); a job
#: that never steps again has it stopped by the memory watch's thread, which runs from the
#: window's start (a thread started at its end cost the last step's timing up to 50 ms).
LINGER_S = 1.0


# --- scheduler and servers: recorded, not profiled ---------------------------------------------


class _RoleRecord:
    """The status of a scheduler or server process, written at start and at exit."""

    def __init__(self, config: Config, role: str):
        self.config = config
        index = os.environ.get("DMLC_TASK_ID") or os.environ.get("DMLC_SERVER_ID")
        self.folder = Path(config.run_dir) / "raw" / f"{role}-{index or os.getpid()}"
        info = detect_rank(os.environ)
        self.status = Status(-1, info.world_size, info.local_rank, ROLE_VARIABLE)
        self.status.role = role
        self.status.framework = "mxnet"
        self.status.notes.append(
            f"MXNet parameter-server {role} (DMLC_ROLE={role})"
            + (": profiled through worker 0's KVStore" if role == "server" else ": not profiled")
        )
        self.finished = False

    def write(self) -> None:
        self.status.write_to(self.folder)

    def finish(self, state: str | None = None, detail: str | None = None) -> None:
        if self.finished or state is None:
            return
        self.finished = True
        self.status.state, self.status.detail = state, detail
        self.status.ended_ns = time.time_ns()
        with contextlib.suppress(Exception):  # the profile worker 0 had it dump, if any
            self.status.trace_files = sorted(
                p.name for p in self.folder.glob(f"rank*_{SERVER_TRACE}") if p.is_file()
            )
        with contextlib.suppress(Exception):
            self.write()


def prepare(config: Config) -> None:
    """At start-up of every process: record a parameter-server scheduler or server; a server
    runs in its folder from right before ``import mxnet`` starts it (its profile lands there)."""
    role = os.environ.get(ROLE_VARIABLE, "").strip().lower()
    if role not in SERVER_ROLES:
        return
    record = _RoleRecord(config, role)
    record.write()
    install_exit_handlers(record)
    if role == "server":
        sys.meta_path.insert(
            0, AfterImport("mxnet", lambda module: None, before=lambda: os.chdir(record.folder))
        )


# --- workers ---------------------------------------------------------------------------------------


class _Timed:
    """An iterator whose ``next`` is marked as a profiler Task while traceview records."""

    def __init__(self, inner: Iterator[Any], collector: MXNetCollector, name: str):
        self.inner = inner
        self.collector = collector
        self.name = name

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        task = self.collector.task(self.name)
        record = self.collector.record()
        left = record.phase(IO_PHASE) if record is not None else 0
        try:
            return next(self.inner)
        except StopIteration:
            raise
        except BaseException:
            if record is not None:
                record.raised_in(IO_PHASE)
            raise
        finally:
            if record is not None:
                record.restore(left)
            if task is not None:
                with contextlib.suppress(Exception):
                    task.stop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class MXNetCollector(PacedCollector):
    """Drives mx.profiler from the trainer's step (one profiled window per process)."""

    framework = "mxnet"

    def __init__(self, config: Config, mx: Any):
        super().__init__(config)
        self.mx = mx
        # Weak: a KVStore kept alive into the interpreter's teardown aborts a dist worker
        # (its ps-lite shutdown then runs after MXNet's own).
        self._kvstore: Any = None
        self.recorded = 0
        self.recording = False
        self.domain: Any = None
        self.step_task: Any = None
        self.raw_path: Path | None = None
        self.user_profiler = False
        self.window_done = False
        self.written = False
        self.stop_pending = False
        self.server_profiling = False  # worker 0 started the servers' profilers
        # the profiler's own functions, kept when the watch below replaces them
        self._set_state: Any = mx.profiler.set_state
        self._set_config: Any = mx.profiler.set_config
        self._dump: Any = mx.profiler.dump
        self.user_file = "profile.json"
        self.linger_until: float | None = None  # when the watch stops a profiler left running

    def _memory_cap(self) -> MemoryCap:
        # mx.profiler is the process's, not a thread's: past the cap it is stopped from the
        # watching thread itself
        return MemoryCap(
            self.config.max_memory, lambda: None, self._stop_for_memory, tick=self._tick
        )

    def _framework_version(self) -> str:
        return str(self.mx.__version__)

    # hooks -----------------------------------------------------------------------------------

    def _hook(self) -> None:
        mx = self.mx
        trainer = mx.gluon.Trainer
        for name in ("step", "update"):
            self._after(trainer, name, lambda owner, result: self.after_step(owner))
        module = getattr(getattr(mx, "module", None), "Module", None)
        if module is not None:
            self._after(module, "update", lambda owner, result: self.after_step(owner))
        self._after(mx.kv, "create", lambda owner, result: self._remember_kvstore(result))
        loader = mx.gluon.data.DataLoader
        original_iter = loader.__iter__
        collector = self

        def loader_iter(self: Any) -> Any:
            return _Timed(original_iter(self), collector, "DataLoader.next")

        loader.__iter__ = loader_iter
        self._mark_data_iterators(mx.io.DataIter)
        # The Python side of each phase: where the engine idles, it waits for these calls.
        self._region(mx.gluon.utils, "split_and_load", "split_and_load")
        self._region(mx.gluon.Block, "__call__", "Block.forward", outermost=True)
        self._region(mx.autograd, "backward", "autograd.backward")
        self._region(mx.nd.NDArray, "backward", "autograd.backward")
        self._region(trainer, "step", "Trainer.step")
        self._region(trainer, "_allreduce_grads", "Trainer.allreduce_grads")
        self._region(trainer, "_update", "Trainer.update")
        # In the step record, always: the gradients' reduction (pushed and pulled through the
        # KVStore: the call returns once the engine has them), a step's one collective call
        self.mark_collective(trainer, "_allreduce_grads", "all_reduce", _kvstore_group, ASYNC)
        self._watch_user_profiler()

    def _mark_data_iterators(self, base: Any) -> None:
        """Mark ``mx.io.DataIter`` batches as ``DataIter.next`` Tasks, whether the script calls
        ``next(it)``, ``for batch in it`` or ``it.next()``: ``__next__`` and every iterator
        class's own ``next`` (those defined later too), the outermost call only."""
        depth = threading.local()

        loading = threading.local()  # (the step record's io phase, its outermost call)

        def mark(cls: Any) -> None:
            own = cls.__dict__.get("next")
            if callable(own) and not hasattr(own, "__wrapped__"):
                self._region(cls, "next", "DataIter.next", outermost=True, depth=depth)
                self.mark_phase(cls, "next", IO_PHASE, loading)

        every_subclass(base, mark)
        self._region(base, "__next__", "DataIter.next", outermost=True, depth=depth)
        self.mark_phase(base, "__next__", IO_PHASE, loading)

    # the user API (traceview.collectors.step / phase) ----------------------------------------

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A region ``## name ##`` of the Python thread while recording (the rules read data,
        forward, backward, optimizer as those phases)."""
        task = self.task(f"## {name} ##")
        try:
            yield
        finally:
            if task is not None:
                with contextlib.suppress(Exception):
                    task.stop()

    def _after(self, owner: Any, name: str, callback: Any) -> None:
        original = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                callback(args[0] if args else None, result)
            except Exception as exc:  # never break the job
                self._failed(exc)
            return result

        replace(owner, name, wrapped, original)

    @property
    def kvstore(self) -> Any:
        return self._kvstore() if self._kvstore is not None else None

    def _region(
        self, owner: Any, name: str, label: str, outermost: bool = False, depth: Any = None
    ) -> None:
        """Mark calls of ``owner.name`` as a profiler Task ``label`` while recording (only the
        outermost call where calls nest, as blocks inside blocks do; ``depth`` shared by methods
        that call each other)."""

        def begin(level: int) -> Any:
            return self.task(label) if not (outermost and level) else None

        def end(task: Any) -> None:
            if task is not None:
                with contextlib.suppress(Exception):
                    task.stop()

        mark_calls(owner, name, self, begin, end, depth)

    def _remember_kvstore(self, kv: Any) -> None:
        if kv is None:
            return
        with contextlib.suppress(TypeError):
            if self.kvstore is None or "dist" in str(getattr(kv, "type", "")):
                self._kvstore = weakref.ref(kv)

    def _watch_user_profiler(self) -> None:
        """A script that drives mx.profiler itself keeps it: traceview steps aside and keeps
        the script's latest dump as the rank's trace."""
        profiler = self.mx.profiler
        original_state, original_config = profiler.set_state, profiler.set_config
        original_dump = profiler.dump
        collector = self

        def set_state(state: str = "stop", profile_process: str = "worker") -> Any:
            if not collector.recording and not collector.finished:
                collector.user_profiler = True
            return original_state(state, profile_process)

        def set_config(**kwargs: Any) -> Any:
            collector.user_file = str(kwargs.get("filename", "profile.json"))
            return original_config(**kwargs)

        def dump(*args: Any, **kwargs: Any) -> Any:
            result = original_dump(*args, **kwargs)
            if collector.user_profiler and not collector.recording:
                try:
                    collector._keep_user_trace(Path(collector.user_file))
                except Exception as exc:
                    warn(f"could not keep the script's trace ({exc})")
            return result

        profiler.set_state, profiler.set_config, profiler.dump = set_state, set_config, dump
        self._set_state, self._set_config, self._dump = (
            original_state,
            original_config,
            original_dump,
        )

    def _keep_user_trace(self, path: Path) -> None:
        if not path.is_file():
            return
        if self.status is None:
            self.status = self._new_status()
        self.status.user_profiler = True
        if not any("itself" in note for note in self.status.notes):
            self.status.notes.append("the script runs mx.profiler itself; its trace is kept")
        folder = rank_dir(self.config.run_dir, self.status.rank)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"rank-{self.status.rank}{TRACE_SUFFIX}"
        write_gzip(path, target, TRACE_GZIP_LEVEL)
        self.status.trace_files = [target.name]
        self.status.write(self.config.run_dir)

    # the schedule ----------------------------------------------------------------------------

    def task(self, name: str) -> Any:
        """A started profiler Task named ``name`` while recording, else None."""
        if not self.recording:
            return None
        try:
            task = self.mx.profiler.Task(self.domain, name)
            task.start()
            return task
        except Exception:
            return None

    def _step_after_window(self) -> None:
        if self.stop_pending:
            self._stop_profiler()

    def record(self) -> StepRecord | None:
        """The step record (``Collector.record``); in a parameter-server job, from the first
        step's end on: its rank is the KVStore's, which the trainer makes at its first step."""
        if self.pacer is None and os.environ.get(ROLE_VARIABLE):
            return None
        return super().record()

    def _paced_step_known(self, owner: Any) -> None:
        if owner is not None and self.kvstore is None:
            self._remember_kvstore(getattr(owner, "_kvstore", None))

    def _paced_step(self, owner: Any) -> None:
        """The pacer (a trainer or module, the first that steps) ended a step."""
        self.steps_seen += 1
        before = self.config.skip + self.config.warmup
        if self.steps_seen < before:
            return
        if self.user_profiler:
            self._step_aside()
            return
        if not self.recording:
            self._start()
            sample_resident(self.status, self.config)
            return
        sample_resident(self.status, self.config)
        self.recorded += 1
        if self.recorded >= self.config.active:
            self._end_window()  # the last step's Task ends once the engine is done
            return
        if self.cap.reached:  # past the memory cap: the step that ended is kept
            step = self.config.warmup + self.recorded - 1
            self._end_window(linger=False)
            self._stop_early(step)
            return
        assert self.step_task is not None  # (recording)
        self.step_task.stop()
        self._next_task()

    def _next_task(self) -> None:
        number = self.config.warmup + self.recorded
        self.step_task = self.mx.profiler.Task(self.domain, f"step#{number}")
        self.step_task.start()

    def _rank(self) -> RankInfo:
        kv = self.kvstore
        with contextlib.suppress(Exception):
            if kv is not None and "dist" in str(kv.type):
                info = detect_rank(os.environ)
                return RankInfo(int(kv.rank), int(kv.num_workers), info.local_rank, "kvstore")
        task = os.environ.get("DMLC_TASK_ID")
        if os.environ.get(ROLE_VARIABLE) == "worker" and task is not None and task.isdigit():
            workers = int(os.environ.get("DMLC_NUM_WORKER", "0") or 0)
            return RankInfo(int(task), max(workers, int(task) + 1), 0, "DMLC_TASK_ID")
        return detect_rank(os.environ)

    def _new_status(self) -> Status:
        status = super()._new_status()
        status.role = os.environ.get(ROLE_VARIABLE, "").strip().lower() or None
        if self.kvstore is not None:
            with contextlib.suppress(Exception):
                status.kvstore = str(self.kvstore.type)
                status.notes.append(f"KVStore {self.kvstore.type}")
        return status

    def _start(self) -> None:
        mx = self.mx
        self.status = info = self._new_status()
        folder = rank_dir(self.config.run_dir, info.rank)
        folder.mkdir(parents=True, exist_ok=True)
        self.raw_path = folder / f".rank-{info.rank}.{os.getpid()}.mxnet.json"
        self.cap.start()  # its thread starts here, before the window: not inside a step of it
        mx.nd.waitall()  # the window starts with an idle engine
        # profile_all includes the storage counters (profile_memory); --no-memory leaves them out
        every = (
            {"profile_all": True}
            if self.config.profile_memory
            else {
                "profile_symbolic": True,
                "profile_imperative": True,
                "profile_api": True,
                "profile_memory": False,  # (MXNet's default is True)
            }
        )
        self._set_config(
            **every,
            aggregate_stats=False,
            continuous_dump=False,
            filename=str(self.raw_path),
        )
        self.domain = mx.profiler.Domain(DOMAIN)
        self._set_state("run")
        self._server_profile(every)
        self.recording = True
        self.status.state = "profiling"
        self.status.write(self.config.run_dir)
        self._next_task()

    def _end_window(self, linger: bool = True) -> None:
        """The last recorded step is over: its Task ends once the engine has done the step's
        work (the job waits for that right after, as a rule). Stopping the profiler takes
        milliseconds: it waits for the next step's end, or LINGER_S (the watch), or the exit, so
        that the job's timing of its last recorded step does not see it. The trace is written at
        exit (``finish``)."""
        self.finished = True
        self.recording = False
        self.window_done = True
        try:
            self.mx.nd.waitall()
            if self.step_task is not None:
                self.step_task.stop()
        except Exception as exc:
            warn(f"could not end the last step ({type(exc).__name__}: {exc})")
        if self.status is not None:
            self.status.state = "running"
            self.status.profiled_steps = self.recorded
        self.stop_pending = True
        if linger:
            self.linger_until = time.monotonic() + LINGER_S

    def _tick(self) -> None:
        """From the watching thread: no step came within LINGER_S of the window's end, so stop
        the profiler from here, or it would record the rest of the job (an evaluation, a loop
        without Trainer.step)."""
        due = self.linger_until
        if due is not None and self.stop_pending and time.monotonic() >= due:
            with self.lock:
                self._stop_profiler()

    def _stop_for_memory(self) -> None:
        """From the watching thread, past the memory cap: the step in progress is dropped (its
        Task never ends, so it is not in the trace), the steps before it are written."""
        with self.lock:
            if not self.recording:
                return
            step = self.config.warmup + self.recorded
            self.recording = False
            self.finished = self.window_done = True
            if self.status is not None:
                self.status.state = "running"
                self.status.profiled_steps = self.recorded
            self.stop_pending = True
            self._stop_early(step)

    def _stop_early(self, step: int) -> None:
        """Stop the profiler before --steps (the memory cap), write the trace now and say why."""
        self._stopped_early(step)
        self._stop_profiler()
        if not self.written:
            self.written = True
            self._write_trace()
        self.write_status()

    def _stop_profiler(self) -> None:
        self.cap.close()
        if not self.stop_pending:
            return
        self.stop_pending = False
        try:
            self._set_state("stop")
        except Exception as exc:
            warn(f"could not stop the profiler ({type(exc).__name__}: {exc})")
        if threading.current_thread() is threading.main_thread():
            self._server_profile(None)  # (the KVStore is the main thread's)
        self.write_status()

    def _server_profile(self, every: dict[str, Any] | None) -> None:
        """Worker 0 of a parameter-server job starts the servers' profilers with its window
        (``every``: the profiler's settings) and, at its end (None), stops them and has them
        write their traces (``prepare``: into their folders)."""
        kv = self.kvstore
        try:
            if kv is None or "dist" not in str(kv.type) or int(kv.rank) != 0:
                return
            if every is not None:
                self._set_config(
                    **every,
                    aggregate_stats=False,
                    continuous_dump=False,
                    filename=SERVER_TRACE,
                    profile_process="server",
                )
                self._set_state("run", profile_process="server")
                self.server_profiling = True
            elif self.server_profiling:
                self.server_profiling = False
                self._set_state("stop", profile_process="server")
                self._dump(profile_process="server")
        except Exception as exc:
            warn(f"could not profile the servers ({type(exc).__name__}: {exc})")

    def _end_profile(self, at_exit: bool) -> None:
        """At exit (or when the window ends): write what was recorded."""
        if self.recording:  # the process ends inside the window
            self._end_window(linger=False)
        self.finished = True
        self._stop_profiler()
        if self.server_profiling and threading.current_thread() is threading.main_thread():
            self._server_profile(None)
        if self.window_done and not self.written:
            self.written = True
            self._write_trace()

    def _write_trace(self) -> None:
        status = self.status
        assert status is not None  # (the window ran)
        try:
            self._dump(finished=False)
            assert self.raw_path is not None
            target = self.raw_path.with_name(f"rank-{status.rank}{TRACE_SUFFIX}")
            write_gzip(self.raw_path, target, TRACE_GZIP_LEVEL)
            self.raw_path.unlink()
            status.trace_files = [target.name]
        except Exception as exc:
            warn(f"could not write the trace ({type(exc).__name__}: {exc})")
            status.notes.append(f"trace not written: {exc}")

    def _step_aside(self) -> None:
        self.finished = True
        warn("the script drives mx.profiler itself; its trace is kept instead")

    def _drop_profile(self) -> None:
        if self.recording:
            self.recording = False
            with contextlib.suppress(Exception):
                self._set_state("stop")


def start(config: Config, mxnet: Any) -> None:
    """Called once the job has imported mxnet (a worker, or a job without a parameter server)."""
    global _collector
    if os.environ.get(ROLE_VARIABLE, "").strip().lower() in SERVER_ROLES:
        return  # not reached in practice: the import runs the server and exits
    _collector = MXNetCollector(config, mxnet)
    _collector.install()


def current() -> MXNetCollector | None:
    return _collector


def _kvstore_group(trainer: Any) -> str:
    """The process group of a trainer's reduction: its KVStore's type (``dist_sync``...)."""
    return f"kvstore:{getattr(getattr(trainer, '_kvstore', None), 'type', None) or 'local'}"
