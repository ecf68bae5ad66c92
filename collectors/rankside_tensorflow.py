"""What `traceview collect` runs inside a TensorFlow process (standard library only).

Loaded from the bootstrap package beside the runtime (``rankside.py``), which calls
``start(config, tf)`` right after the job imports ``tensorflow``; the collector is a
``rankside_lifecycle.Collector``. Steps are found without touching the script:

- Keras ``Model.fit``: a callback is added, whose batch begin and end bound each step;
- custom training loops: every ``next()`` on a tf.data iterator (plain or distributed) starts a
  step, which ends at the next one;
- the user API (``traceview.collectors.step()``) when the script marks steps itself.

After ``--skip`` steps, ``tf.profiler.experimental`` starts; the next ``--warmup`` steps run
profiled but unmarked, then ``--steps`` steps are marked with ``Trace("train", step_num=N)``,
and the profiler stops. Its XSpace is moved to ``RUN/raw/rank-NNNNN/<host>.xplane.pb``. The rank
comes from the launcher's variables, else from TF_CONFIG (MultiWorkerMirroredStrategy).

As everywhere in the rank-side code, a failure prints one ``traceview:`` line and the job runs on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .rankside import (
    AfterImport,
    Config,
    RankInfo,
    _collectors,
    detect_rank,
    rank_dir,
    sample_resident,
    warn,
)
from .rankside_lifecycle import Collector
from .rankside_record import IO_PHASE

# Who marks steps, by precedence: the script itself, Keras' batches, then iterator calls.
_SOURCES = ("iterator", "keras", "manual")
_LOGDIR = ".tfprofile"
STOPPING = "stopping"  # status state while the profiler stops (see _stop)


def rank_from_tf_config(value: str | None) -> tuple[int, int] | None:
    """(rank, world size) of a worker from TF_CONFIG: the chief first, then the workers."""
    if not value:
        return None
    try:
        config = json.loads(value)
        cluster, task = config.get("cluster", {}), config.get("task", {})
        chiefs = len(cluster.get("chief", []))
        workers = len(cluster.get("worker", []))
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return None
    if kind == "chief":
        return index, chiefs + workers
    if kind == "worker":
        return chiefs + index, chiefs + workers
    return None


class TensorFlowCollector(Collector):
    framework = "tensorflow"

    def __init__(self, config: Config, tf: Any):
        super().__init__(config)
        self.tf = tf
        self.source: str | None = None  # who marks the steps (see _SOURCES)
        self.begun = 0  # steps begun so far
        self.stepping = False  # a step has begun and not ended (the step record's)
        self.marker: Any = None  # the open Trace("train", step_num=N) of the current step
        self.window_start = config.skip  # the job's step the window's profile begins in
        self.profiling = False
        self.logdir: Path | None = None
        self.inside_next = threading.local()
        self.busy = 0  # inside boundary() or end_step() (a stop waits for them)

    # set-up -------------------------------------------------------------------------------

    def _framework_version(self) -> str:
        return str(self.tf.__version__)

    def _hook(self) -> None:
        """Every ``next()`` on a tf.data iterator begins a step."""
        collector = self

        def wrap(cls: Any) -> None:
            original = cls.__next__

            def __next__(iterator: Any) -> Any:
                outer = not getattr(collector.inside_next, "active", False)
                record = None
                if outer:  # a distributed iterator's next() calls the plain one: count once
                    collector.boundary("iterator")
                    collector.inside_next.active = True
                    record = collector.record()
                left = record.phase(IO_PHASE) if record is not None else 0
                try:
                    return original(iterator)
                except StopIteration:
                    raise
                except BaseException:
                    if record is not None:
                        record.raised_in(IO_PHASE)
                    raise
                finally:
                    if outer:
                        collector.inside_next.active = False
                    if record is not None:
                        record.restore(left)

            cls.__next__ = __next__

        from tensorflow.python.data.ops import iterator_ops

        wrap(iterator_ops.OwnedIterator)
        with contextlib.suppress(ImportError, AttributeError):
            from tensorflow.python.distribute import input_lib

            wrap(input_lib.DistributedIterator)

    def hook_keras(self, keras: Any) -> None:
        """Add a step-marking callback to every ``Model.fit``."""
        collector = self
        base = keras.callbacks.Callback

        class _Steps(base):  # type: ignore[misc, valid-type]
            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                collector.boundary("keras")

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                collector.end_step("keras")

        model_cls = keras.Model
        original = model_cls.fit

        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            if len(args) <= 5:  # callbacks is fit's 6th positional parameter
                with contextlib.suppress(Exception):
                    kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _Steps()]
            return original(model, *args, **kwargs)

        model_cls.fit = fit

    # steps ----------------------------------------------------------------------------------

    def manual_step(self) -> None:
        self.boundary("manual")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self.tf.profiler.experimental.Trace(f"## {name} ##"):
            yield

    def _accepts(self, source: str) -> bool:
        """The first source seen wins, unless one with more precedence appears later."""
        if self.source is None or _SOURCES.index(source) > _SOURCES.index(self.source):
            self.source = source
        return source == self.source

    def boundary(self, source: str) -> None:
        """A step begins (and the one before it ends)."""
        with self.lock:
            if not self._accepts(source):
                return
            if self.stepping and source != "keras":  # (Keras' batch end ended it)
                self.record_step_end()
            self.stepping = True
            record = self.record()
            if record is not None:
                record.step_begin()
            if self.finished:
                asked = self.window_asked()  # (a window asked of the job: traceview profile)
                if asked is None or (self.status is not None and self.status.user_profiler):
                    self.begun += 1
                    return
                self.window_start = self.open_window(asked)
                self.begun = self.window_start  # (the record's count: the job's number)
            self.busy += 1
            try:
                if self.profiling and self.cap.reached:  # the step that ended is kept
                    self._stop_early(mid_step=False)
                    return
                self._close_marker()
                number = self.begun
                self.begun += 1
                first_marked = self.window_start + self.window_warmup
                if number == self.window_start:
                    self._start()
                if self.profiling:
                    sample_resident(self.status, self.config)
                if number >= first_marked + self.window_active:
                    self.finish()
                elif self.profiling and number >= first_marked:
                    marker = self.tf.profiler.experimental.Trace("train", step_num=number, _r=1)
                    marker.__enter__()
                    self.marker = marker
                    assert self.status is not None  # (profiling)
                    self.status.profiled_steps += 1
            except Exception as exc:
                self._failed(exc)
            finally:
                self.busy -= 1

    def _stop_for_memory(self) -> None:
        """On the main thread, interrupted past the memory cap: stop now (a step still open is
        cut short and left out); not while traceview's own code runs on it."""
        with self.lock:
            if not self.busy and self.profiling:
                self._stop_early(mid_step=self.marker is not None)

    def _stop_early(self, mid_step: bool) -> None:
        """Stop the profile before its --steps (the memory cap): write what it has, say why in
        the status, and leave the job to run on unprofiled."""
        status = self.status
        assert status is not None  # (profiling)
        # the step in progress, or (at a boundary) the one that ended
        self._stopped_early(self.begun - 1, mid_step)
        if mid_step:
            status.profiled_steps = max(status.profiled_steps - 1, 0)
        self.finish()

    def end_step(self, source: str) -> None:
        """A step ends without the next one beginning yet (Keras' batch end)."""
        with self.lock:
            if self.stepping and source == self.source:
                self.record_step_end()
                self.stepping = False
            if not self.finished and source == self.source:
                self.busy += 1
                try:
                    with contextlib.suppress(Exception):
                        self._close_marker()
                finally:
                    self.busy -= 1

    def _close_marker(self) -> None:
        marker, self.marker = self.marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    # the profiler ---------------------------------------------------------------------------

    def _rank(self) -> RankInfo:
        info = detect_rank(os.environ)
        if info.source == "default":
            from_config = rank_from_tf_config(os.environ.get("TF_CONFIG"))
            if from_config is not None:
                return RankInfo(from_config[0], from_config[1], 0, "TF_CONFIG")
        return info

    def _start(self) -> None:
        tf = self.tf
        self.status = self._new_status()
        self.status.began_step = self.window_start
        self.status.first_step = self.window_start + self.window_warmup
        self.logdir = rank_dir(self.window_dir(), self.status.rank) / _LOGDIR
        self.cap.start()  # its thread starts before the profile, not inside a step of it
        try:
            tf.profiler.experimental.start(str(self.logdir))
        except Exception as exc:  # the script profiles on its own (one session per process)
            self.cap.close()
            self.status.user_profiler = True
            self.status.notes.append(f"tf.profiler not started ({type(exc).__name__}): {exc}")
            self.status.write(self.window_dir())
            self.finished = True
            return
        self.profiling = True
        self.status.state = "profiling"
        self.status.write(self.window_dir())

    def _stop_profiler(self) -> None:
        """Stop the profiler and move its XSpace next to the status."""
        self._close_marker()
        if not self.profiling:
            return
        self.profiling = False
        assert self.logdir is not None and self.status is not None
        # TensorFlow's profiler can corrupt the heap while it collects the events (2.21, seen
        # in TraceMeRecorder::Consume): the process then aborts or hangs in here. Say so in
        # the status, in case.
        state, self.status.state = self.status.state, STOPPING
        self.status.detail = "died inside tf.profiler.experimental.stop()"
        with contextlib.suppress(Exception):
            self.status.write(self.window_dir())
        self.tf.profiler.experimental.stop()
        self.status.state, self.status.detail = state, None
        folder = self.logdir.parent
        written = sorted(self.logdir.glob("plugins/profile/*/*.xplane.pb"))
        names = []
        for source in written:
            target = (
                folder / f"{source.name[: -len('.xplane.pb')] or socket.gethostname()}.xplane.pb"
            )
            os.replace(source, target)
            names.append(target.name)
        shutil.rmtree(self.logdir, ignore_errors=True)
        self.status.trace_files = names
        if not names:
            self.status.notes.append("tf.profiler wrote no XSpace")

    def _end_profile(self, at_exit: bool) -> None:
        if self.finished:
            return
        self.finished = True
        self.cap.close()
        status = self.status
        # past the cap, but never stopped on the training thread: at exit, then
        if at_exit and self.cap.reached and self.profiling and status:
            status.stop_reason = status.stop_reason or f"{self.cap.reason}, stopped at exit"
            status.stop_step = self.begun - 1
            status.stop_mid_step = self.marker is not None
        try:
            self._stop_profiler()
        except Exception as exc:
            warn(f"could not write the trace ({type(exc).__name__}: {exc})")
            if self.status is not None:
                self.status.notes.append(f"trace not written: {exc}")

    def _drop_profile(self) -> None:
        with contextlib.suppress(Exception):
            self._stop_profiler()


def start(config: Config, tf: Any) -> None:
    """Called by the runtime once the job has imported tensorflow (unless JAX's collector
    profiles the process: one profiler session per process)."""
    if any(c.framework == "jax" for c in _collectors):
        return
    from .rankside_tf_ps import parameter_server_task, start_task

    task = parameter_server_task(os.environ.get("TF_CONFIG"))
    if task is not None:  # a task of a parameter-server job: its own collector
        start_task(config, tf, *task)
        return
    collector = TensorFlowCollector(config, tf)
    collector.install()
    keras_hook = collector.hook_keras
    for name in ("keras", "tf_keras"):
        if name in sys.modules:
            keras_hook(sys.modules[name])
        else:
            sys.meta_path.insert(0, AfterImport(name, keras_hook))
