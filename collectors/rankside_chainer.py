"""`traceview collect`'s Chainer side, in every process of the job (standard library only).

Loaded from the bootstrap package beside the runtime (``rankside.py``), which calls ``start``
once the job has imported ``chainer``; the collector is a ``rankside_lifecycle.Collector``.
Chainer has no profiler that writes a timeline, so this module is one:

- every ``FunctionNode``'s forward and backward, through a ``chainer.FunctionHook`` registered
  on the training thread for the recorded steps only (function hooks are per thread). Nodes
  that a backward runs (``LinearGradData`` inside ``LinearFunction``'s backward) are recorded
  inside it, as backward;
- regions around the Python calls of each phase: the outermost ``Link.__call__`` (forward),
  ``Variable.backward`` (backward), ``Optimizer.update`` (the update, and with a loss function
  the whole step), a dataset iterator's ``next()`` and a converter's call such as
  ``concat_examples`` (io), ``to_device``/``to_gpu`` (h2d) and the ChainerMN communicator's
  calls (``multi_node_mean_grad``, ``allreduce_grad``, ``bcast_data``, ``allreduce``,
  ``bcast``, ...: comm);
- steps: the end of each ``Optimizer.update`` (of the first optimizer that updates; or of
  ``traceview.collectors.step()`` once the script calls it). After ``--skip`` + ``--warmup``
  steps the next ``--steps`` are recorded, each marked ``step#N``.

The trace is Chrome-trace JSON, written to ``RUN/raw/rank-NNNNN/rank-N.chainer.json.gz`` at the
end of the first step after the window, else 1-2 s after the window, else when the process
exits (normally, by an exception, by SIGTERM: an exit inside the window keeps the steps it
ended); Perfetto opens it. The rank is the ChainerMN communicator's (remembered at its first
call), else the launcher's (the runtime's ``detect_rank``).

Nothing here may break the job: a failure prints one ``traceview:`` line and the job runs on.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from .rankside import AfterImport, Config, MemoryCap, RankInfo, detect_rank, rank_dir, warn
from .rankside_lifecycle import PacedCollector, every_subclass, mark_calls, replace
from .rankside_record import IO_PHASE

TRACE_SUFFIX = ".chainer.json.gz"
#: Top-level key of the trace that says who wrote it (the parser sniffs it).
HEADER_KEY = "traceviewChainer"
HOOK_NAME = "traceview"
#: ChainerMN communicator methods recorded as communication (the outermost call only), and
#: the collective each is in the step record.
COMM_METHODS = {
    "multi_node_mean_grad": "all_reduce",
    "allreduce_grad": "all_reduce",
    "bcast_data": "broadcast",
    "broadcast_data": "broadcast",
    "allreduce": "all_reduce",
    "allreduce_obj": "all_reduce",
    "bcast": "broadcast",
    "bcast_obj": "broadcast",
    "allgather": "all_gather",
    "alltoall": "all_to_all",
    "gather": "gather",
    "gather_obj": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "send_obj": "send",
    "recv_obj": "recv",
}
#: Past this many events (a runaway graph) the window ends with the step that passed it.
MAX_EVENTS = 5_000_000
#: The trace is written 1-2 of these seconds after the window's end, unless a step ends before
#: that (then at its end) or the process exits.
LINGER_S = 1.0

_collector: ChainerCollector | None = None


#: Event categories, by code. "node_backward" is a node's own backward, written as the category
#: "backward" and the name "<label>.backward" (built when the trace is written, not per node).
CATEGORIES = ("forward", "backward", "node_backward", "python", "io", "h2d", "comm", "update")
CATEGORY = {name: code for code, name in enumerate(CATEGORIES)}
STEP = len(CATEGORIES)  # a step marker (category "traceview")


class _Events:
    """Recorded events as columns: names, category codes and integer times (no object per
    event: thousands a step, each one more allocation in the job's step)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.cats = bytearray()
        self.starts = array("q")
        self.durations = array("q")
        self.tids = array("q")

    def add(self, name: str, cat: int, start: int, duration: int, tid: int) -> None:
        self.names.append(name)
        self.cats.append(cat)
        self.starts.append(start)
        self.durations.append(duration)
        self.tids.append(tid)

    def __len__(self) -> int:
        return len(self.names)

    def clear(self) -> None:
        del self.names[:], self.cats[:], self.starts[:], self.durations[:], self.tids[:]


class ChainerCollector(PacedCollector):
    """Records one window of steps of a Chainer job as Chrome-trace events."""

    framework = "chainer"

    def __init__(self, config: Config, chainer: Any):
        super().__init__(config)
        self.chainer = chainer
        self.communicator: Any = None
        self.groups: dict[int, str] = {}  # id() of a communicator -> its group in the record
        self.multi_node = threading.local()  # inside a ChainerMN multi-node optimizer's update
        self.recorded = 0
        self.recording = False
        self.write_pending = False  # the window is over, its trace not yet written
        self.thread: int | None = None  # native id of the training thread
        self.hooks: Any = None  # the training thread's function-hook dictionary
        self.events = _Events()  # every recorded event
        self.stack: list[int] = []  # start times of the nodes in progress (training thread)
        self.backward_depth = [0]
        self.step_start = 0
        # perf_counter_ns + offset = the wall clock (one reading, so intervals stay monotonic)
        self.offset = time.time_ns() - time.perf_counter_ns()

    def _memory_cap(self) -> MemoryCap:
        # past --max-profile-memory the window ends from the watching thread: the function hooks
        # and regions only append to lists, so they may be stopped from any thread
        return MemoryCap(self.config.max_memory, lambda: None, self._stop_for_memory)

    def _framework_version(self) -> str:
        return str(getattr(self.chainer, "__version__", ""))

    # hooks -------------------------------------------------------------------------------------

    def _hook(self) -> None:
        chainer = self.chainer
        collector = self
        updating = threading.local()  # one depth for both: a subclass's update may call its base's
        self._after(chainer.Optimizer, "update", updating)
        if "update" in vars(chainer.GradientMethod):
            self._after(chainer.GradientMethod, "update", updating)
        self._region(chainer.Link, "__call__", "Link.forward", "python")
        self._region(chainer.Variable, "backward", "Variable.backward", "python")
        loading = threading.local()  # the step record's io phase: iterators and converters
        self._iterators(chainer.dataset.Iterator, loading)
        with contextlib.suppress(AttributeError):  # batches made by a converter (concat_examples)
            converting = threading.local()

            def mark_converter(cls: Any) -> None:
                own = cls.__dict__.get("__call__")
                if callable(own) and not hasattr(own, "__traceview__"):
                    self._region(cls, "__call__", "Converter", "io", depth=converting)
                    self.mark_phase(cls, "__call__", IO_PHASE, loading)

            every_subclass(chainer.dataset.convert.Converter, mark_converter)
        for module_name in ("chainer.dataset.convert", "chainer.dataset"):
            module = sys.modules.get(module_name)
            if module is not None and hasattr(module, "to_device"):
                self._region(module, "to_device", "to_device", "h2d")
        with contextlib.suppress(Exception):
            cuda = chainer.backends.cuda
            self._region(cuda, "to_gpu", "to_gpu", "h2d")

        base = chainer.FunctionHook
        # Called around every node (thousands a step): kept to a perf_counter read and appends
        # to the event columns. Function hooks are the thread's own and this one is registered
        # on the training thread only, so the start stack and backward depth need no
        # thread-local storage.
        perf = time.perf_counter_ns
        stack = self.stack
        depth = self.backward_depth  # [nesting of backward calls]
        names, cats = self.events.names.append, self.events.cats.append
        starts, durations = self.events.starts.append, self.events.durations.append
        tids = self.events.tids.append
        forward, backward, node_backward = (
            CATEGORY["forward"],
            CATEGORY["backward"],
            CATEGORY["node_backward"],
        )

        def label(function: Any) -> str:
            try:
                return str(function.label)
            except Exception:  # never break the job
                return type(function).__name__

        class _Hook(base):  # type: ignore[misc, valid-type]
            name = HOOK_NAME

            def forward_preprocess(self, function: Any, in_data: Any) -> None:
                stack.append(perf())

            def forward_postprocess(self, function: Any, in_data: Any) -> None:
                end = perf()
                if stack:
                    start = stack.pop()
                    names(label(function))
                    cats(backward if depth[0] else forward)  # a node a backward runs
                    starts(start)
                    durations(end - start)
                    tids(collector.thread or 0)

            def backward_preprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
                depth[0] += 1
                stack.append(perf())

            def backward_postprocess(self, function: Any, in_data: Any, out_grad: Any) -> None:
                end = perf()
                depth[0] -= 1
                if stack:
                    start = stack.pop()
                    names(label(function))
                    cats(node_backward)
                    starts(start)
                    durations(end - start)
                    tids(collector.thread or 0)

        self.hook = _Hook()

    def hook_communicators(self, module: Any) -> None:
        """Record the ChainerMN communicators' calls as communication (``module``: chainermn's
        ``communicator_base``, hooked when it is imported: ``create_communicator`` imports the
        communicator classes only when called)."""
        depth = threading.local()  # one for all: allreduce_grad calls multi_node_mean_grad
        collector = self

        calling = threading.local()  # (the step record's: the outermost call, as above)

        def mark(cls: Any) -> None:
            for name in COMM_METHODS:
                own = cls.__dict__.get(name)
                if callable(own) and not hasattr(own, "__traceview__"):
                    replace(cls, name, collector._comm_call(own, name, depth), own)
                    op = COMM_METHODS[name]
                    collector.mark_collective(cls, name, op, collector._group, depth=calling)

        every_subclass(module.CommunicatorBase, mark)

    def hook_optimizers(self, module: Any) -> None:
        """A ChainerMN multi-node optimizer's update ends each step (``module``: chainermn's
        ``optimizers``): its first update only broadcasts the parameters (the double-buffering
        one's first two do not update either), so the actual optimizer's updates would leave
        the job's first steps out of the count."""
        for name in ("_MultiNodeOptimizer", "_DoubleBufferingOptimizer"):
            cls = getattr(module, name, None)
            if cls is not None and "update" in vars(cls):
                replace(cls, "update", self._multi_node_update(cls.update), cls.update)

    def _multi_node_update(self, original: Any) -> Any:
        collector, inside = self, self.multi_node

        def wrapped(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            inside.active = True  # (its actual optimizer's update is recorded, but paces not)
            try:
                result = original(optimizer, *args, **kwargs)
            finally:
                inside.active = False
            try:
                collector.after_step(optimizer)
            except Exception as exc:  # never break the job
                collector._failed(exc)
            return result

        return wrapped

    def _group(self, communicator: Any) -> str:
        """A communicator's process group in the step record: ``chainermn`` for the first one
        the script calls, ``chainermn#2``... for the others, in the order of their first call
        (the same on every rank of one script)."""
        key = id(communicator)
        name = self.groups.get(key)
        if name is None:
            number = len(self.groups) + 1
            name = self.groups[key] = "chainermn" if number == 1 else f"chainermn#{number}"
        return name

    def _comm_call(self, original: Any, method: str, depth: Any) -> Any:
        collector = self

        def wrapped(communicator: Any, *args: Any, **kwargs: Any) -> Any:
            if collector.communicator is None:
                collector.communicator = communicator  # the rank, when recording starts
            if not collector.recording:
                return original(communicator, *args, **kwargs)
            level = getattr(depth, "level", 0)
            start = time.perf_counter_ns() if not level else None
            depth.level = level + 1
            try:
                return original(communicator, *args, **kwargs)
            finally:
                depth.level = level
                if start is not None:
                    collector._record(f"{type(communicator).__name__}.{method}", "comm", start)

        return wrapped

    def _iterators(self, base: Any, loading: Any) -> None:
        """Mark a dataset iterator's batches (``next(it)``, ``for batch in it``, ``it.next()``) as
        ``Iterator.next``, and as data loading in the step record (``loading``: its depth):
        every iterator class's own ``__next__``/``next``, those defined later too; the outermost
        call only (``next`` is often ``__next__``)."""
        depth = threading.local()

        def mark(cls: Any) -> None:
            for name in ("__next__", "next"):
                own = cls.__dict__.get(name)
                if callable(own) and not hasattr(own, "__traceview__"):
                    self._region(cls, name, "Iterator.next", "io", depth=depth)
                    self.mark_phase(cls, name, IO_PHASE, loading)

        every_subclass(base, mark)

    def _after(self, owner: Any, name: str, depth: Any) -> None:
        """``owner.name`` (an optimizer's update) recorded as ``Optimizer.update``, and the end
        of a step after it (the outermost call only: a subclass's update calls its base's)."""
        original = getattr(owner, name)
        collector = self

        def wrapped(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            level = getattr(depth, "level", 0)
            start = time.perf_counter_ns() if collector.recording and not level else None
            depth.level = level + 1
            try:
                result = original(optimizer, *args, **kwargs)
            finally:
                depth.level = level
            if level:
                return result
            if start is not None:
                collector._record("Optimizer.update", "update", start)
            if getattr(collector.multi_node, "active", False):
                return result  # (the multi-node optimizer around it ends the step)
            try:
                collector.after_step(optimizer)
            except Exception as exc:  # never break the job
                collector._failed(exc)
            return result

        replace(owner, name, wrapped, original)

    def _region(self, owner: Any, name: str, label: str, cat: str, depth: Any = None) -> None:
        """Record calls of ``owner.name`` as ``label`` while recording (the outermost call of
        nested ones: links inside links; ``depth`` shared by methods that call each other)."""

        def begin(level: int) -> int | None:
            return time.perf_counter_ns() if not level else None

        def end(start: int | None) -> None:
            if start is not None:
                self._record(label, cat, start)

        mark_calls(owner, name, self, begin, end, depth)

    # recording -------------------------------------------------------------------------------

    def _record(self, name: str, cat: str, start: int) -> None:
        end = time.perf_counter_ns()
        if self.recording:
            self.events.add(name, CATEGORY[cat], start, end - start, threading.get_native_id())

    # the schedule ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A region ``## name ##`` while recording (the rules read data, forward, backward,
        optimizer as those phases)."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            if self.recording:
                self._record(f"## {name} ##", "python", start)

    def _step_after_window(self) -> None:
        self._write()  # (if the window's end left it pending)

    def _paced_step(self, owner: Any) -> None:
        """The pacer (the first optimizer that updates) ended a step."""
        self.steps_seen += 1
        if not self.recording:
            if self.steps_seen >= self.config.skip + self.config.warmup:
                self._start()
            return
        now = time.perf_counter_ns()
        number = self.config.warmup + self.recorded
        self.events.add(
            f"step#{number}", STEP, self.step_start, now - self.step_start, self.thread or 0
        )
        self.recorded += 1
        assert self.status is not None  # (recording)
        self.status.profiled_steps = self.recorded
        if self.recorded >= self.config.active or len(self.events) > MAX_EVENTS:
            if len(self.events) > MAX_EVENTS:
                self.status.stop_reason = f"more than {MAX_EVENTS:,} events"
                self.status.stop_step = number
                warn(f"profile stopped at step {number}: {MAX_EVENTS:,} events")
            self._end_window()
            return
        self.step_start = time.perf_counter_ns()

    def _rank(self) -> RankInfo:
        info = detect_rank(os.environ)
        communicator = self.communicator
        with contextlib.suppress(Exception):
            if communicator is not None:
                return RankInfo(
                    int(communicator.rank), int(communicator.size), info.local_rank, "chainermn"
                )
        return info

    def _start(self) -> None:
        self.status = self._new_status()
        if self.communicator is not None:
            self.status.notes.append(f"ChainerMN communicator {type(self.communicator).__name__}")
        self.thread = threading.get_native_id()
        # function hooks are the thread's own: the training thread's, for the window only
        self.hooks = self.chainer.get_function_hooks()
        if HOOK_NAME in self.hooks:
            self.status.notes.append("a function hook named 'traceview' was already there")
        else:
            self.hooks[HOOK_NAME] = self.hook
        threading.Thread(target=self._write_late, name="traceview-writer", daemon=True).start()
        self.stack.clear()
        self.backward_depth[0] = 0
        self.recording = True
        self.status.state = "profiling"
        self.status.write(self.config.run_dir)
        self.cap.start()
        self.step_start = time.perf_counter_ns()

    def _stop_for_memory(self) -> None:
        """From the watching thread, past the memory cap: the step in progress is dropped (it
        gets no step marker), the steps before it are written as at the window's end."""
        with self.lock:
            if not self.recording:
                return
            # (the step in progress gets no marker: nothing of it counts, so not "mid step")
            self._stopped_early(self.config.warmup + self.recorded)
            self._end_window()

    def _end_window(self) -> None:
        """The last recorded step is over. Writing the trace takes milliseconds: it waits for
        the next step's end, or LINGER_S, or the exit, so that the job's own timing of its last
        recorded step does not see it."""
        self.recording = False
        self.finished = True
        self.cap.close()
        if self.hooks is not None:
            with contextlib.suppress(Exception):
                if self.hooks.get(HOOK_NAME) is self.hook:
                    del self.hooks[HOOK_NAME]
        if self.status is not None:
            self.status.state = "running"
        self.write_pending = True

    def _write_late(self) -> None:
        """On a thread started with the window (not at its end, inside the job's timing): write
        the trace 1-2 LINGER_S after the window if no step or exit has done it. It polls once a
        LINGER_S rather than waits on an event: woken by the window's end, it would take the
        interpreter's lock from the training thread inside its last recorded step."""
        seen = False  # the window was over at the last look
        while True:
            time.sleep(LINGER_S)
            if not self.write_pending:
                if self.finished:
                    return  # written at a step's end or at exit (or abandoned)
                continue
            if seen:
                with self.lock:
                    self._write()
                return
            seen = True

    def _write(self) -> None:
        if not self.write_pending:
            return
        self.write_pending = False
        self._write_trace()
        self.write_status()

    def _end_profile(self, at_exit: bool) -> None:
        """At exit (or when the window ends): write what was recorded."""
        if self.recording:  # the process ends inside the window: the open step is dropped
            self._end_window()
        self.finished = True
        self._write()

    def _nothing_recorded(self, state: str | None) -> None:
        if state == "ok" and self.steps_seen == 0:
            warn(
                "the job never stepped a Chainer optimizer: nothing was recorded "
                "(call traceview.collectors.step() to mark steps)"
            )
        elif state == "ok":
            before = self.config.skip + self.config.warmup
            warn(
                f"the job stepped a Chainer optimizer {self.steps_seen} time(s): nothing "
                f"was recorded (the window starts after --skip + --warmup = {before})"
            )

    def _write_trace(self) -> None:
        status = self.status
        assert status is not None  # (the window ran)
        try:
            folder = rank_dir(self.config.run_dir, status.rank)
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / f"rank-{status.rank}{TRACE_SUFFIX}"
            tmp = folder / f".{target.name}.{os.getpid()}.tmp"
            with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as out:
                self._dump(out)
            os.replace(tmp, target)
            status.trace_files = [target.name]
        except Exception as exc:
            warn(f"could not write the trace ({type(exc).__name__}: {exc})")
            status.notes.append(f"trace not written: {exc}")
        self.events.clear()  # (the hook holds its columns)

    def _dump(self, out: Any) -> None:
        status, pid, offset = self.status, os.getpid(), self.offset
        assert status is not None
        header = {
            "rank": status.rank,
            "world_size": status.world_size,
            "host": socket.gethostname(),
            "chainer_version": status.framework_version,
            "communicator": type(self.communicator).__name__ if self.communicator else None,
            "steps": self.recorded,
        }
        out.write(f'{{"{HEADER_KEY}": {json.dumps(header)}, "displayTimeUnit": "ms",\n')
        out.write('"traceEvents": [\n')
        meta: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {status.rank}"}}
        ]
        events = self.events
        for tid in sorted(set(events.tids)):
            what = "training thread" if tid == self.thread else f"thread {tid}"
            meta.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": what}}
            )
        out.write(",\n".join(json.dumps(m) for m in meta))
        dumps: Callable[[Any], str] = json.dumps
        categories = [*CATEGORIES[:2], "backward", *CATEGORIES[3:], "traceview"]
        # (no zip(strict=...): it is Python 3.10's, and Chainer jobs may run an older one)
        for name, cat, start, duration, tid in zip(  # noqa: B905
            events.names, events.cats, events.starts, events.durations, events.tids
        ):
            if cat == CATEGORY["node_backward"]:
                name = f"{name}.backward"
            out.write(
                f',\n{{"ph": "X", "name": {dumps(name)}, "cat": "{categories[cat]}", '
                f'"pid": {pid}, "tid": {tid}, "ts": {_us(start + offset)}, "dur": {_us(duration)}}}'
            )
        out.write("\n]}\n")

    def _drop_profile(self) -> None:
        self.recording = False
        if self.hooks is not None:
            with contextlib.suppress(Exception):
                self.hooks.pop(HOOK_NAME, None)


def _us(ns: int) -> str:
    """Nanoseconds as exact decimal microseconds (a float would round epoch times)."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def start(config: Config, chainer: Any) -> None:
    """Called by the runtime once the job has imported chainer."""
    global _collector
    _collector = ChainerCollector(config, chainer)
    _collector.install()
    # (submodules: chainermn may be the module being imported, chainer imported by it)
    for name, hook in (
        ("chainermn.communicators.communicator_base", _collector.hook_communicators),
        ("chainermn.optimizers", _collector.hook_optimizers),
    ):
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            sys.meta_path.insert(0, AfterImport(name, hook))


def current() -> ChainerCollector | None:
    return _collector
