"""One collector's life inside the job: the typed base of every framework's collector
(standard library only).

Each framework's collector (``rankside_torch``, ``rankside_tensorflow``, ``rankside_mxnet``,
``rankside_chainer``) is a ``Collector`` and lives the same way:

- ``install``: the framework's hooks (``_hook``), the exit handlers, and from then on the user
  API (``traceview.collectors.step``/``phase``) reaches it (``manual_step``, ``phase``);
- the steps, counted by the framework's hooks: after ``--skip`` (and ``--warmup``) steps the
  profile starts, with the rank's status (``_new_status``: rank, framework, clock) and the
  memory cap (``cap``, made by ``_memory_cap``);
- past the cap, ``_stop_for_memory`` stops the profile early and ``_stopped_early`` says why;
- ``finish``: the profile stops and what it recorded is written (``_end_profile``); at exit,
  how the process ended is recorded too; ``abandon``: traceview's own code failed, the profile
  is dropped (``_drop_profile``) and the job left alone; ``write_status``: status.json, never
  raising.

How the rank-side modules find each other: in the repository they are modules of
``traceview.collectors``; `traceview collect` copies every ``rankside*.py`` unchanged into the
job's bootstrap folder as the package ``_traceview_rankside`` (``launch.write_bootstrap``).
They import each other relatively only (``from .rankside import ...``), which resolves in both
packages, so the type checker checks the very calls the job makes.
"""

from __future__ import annotations

import abc
import contextlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from threading import RLock, local
from typing import Any, ClassVar, Protocol, TypeVar

from .rankside import (
    Config,
    MemoryCap,
    RankInfo,
    Status,
    detect_rank,
    install_exit_handlers,
    probe_clock,
    rank_dir,
    register,
    warn,
)
from .rankside_record import FAILED, StepRecord, Taken, op_index


class Collector(abc.ABC):
    """Profiles one window of steps of this process with its framework's profiler, then
    leaves the job alone. Nothing it does may break the job: a failure is one ``traceview:``
    line on stderr, and the job runs on unprofiled."""

    #: the status's ``framework``: pytorch, tensorflow, mxnet, chainer
    framework: ClassVar[str]

    def __init__(self, config: Config) -> None:
        self.config = config
        self.lock = RLock()
        self.status: Status | None = None  # from the profile's start on
        self.finished = False  # the job is left alone from now on
        self.cap = self._memory_cap()
        self._step_record: StepRecord | None = None
        self._step_record_failed = False
        self.window = 0  # the profile window (0: the first; then each one asked of the job)
        # the window's warm-up and recorded steps (the first's: --warmup, --steps)
        self.window_warmup, self.window_active = config.warmup, config.active

    def window_dir(self) -> Path:
        """Where the window's profile and status go: the run directory for the first window,
        RUN/windows/K for the K-th asked of the job (``traceview profile``)."""
        if not self.window:
            return self.config.run_dir
        return self.config.run_dir / "windows" / str(self.window)

    def window_asked(self) -> dict[str, int] | None:
        """At a step boundary after the profiled window: the window asked of the job whose
        first step (less its warm-up) is reached; None: none, or not yet. A window whose steps
        have all passed when it is read is said and dropped."""
        record = self._step_record
        passed: list[dict[str, int]] = []
        try:
            while record is not None and record.asked:
                asked = record.asked[0]
                now = record.step  # the step about to begin (the job's number)
                if now < asked["start_step"] - asked["warmup"]:
                    return None
                record.take_request()
                if now < asked["start_step"] + asked["steps"]:
                    return asked
                passed.append(asked)
            return None
        finally:
            if passed and record is not None:  # (said once, however many: a flood of asks)
                first = passed[0]
                which = (
                    f"profile window {first['window']} not taken: its steps "
                    f"{first['start_step']}-{first['start_step'] + first['steps'] - 1} had"
                    if len(passed) == 1
                    else f"{len(passed)} profile windows ({first['window']} to "
                    f"{passed[-1]['window']}) not taken: their steps had"
                )
                warn(f"{which} passed (step {record.step} now) when this rank read it")

    def open_window(self, asked: dict[str, int]) -> int:
        """Under the lock: the window ``asked`` begins at this step boundary (its warm-up as
        far as it still can); returns the step it begins at."""
        assert self._step_record is not None
        now = self._step_record.step
        self.window = asked["window"]
        self.window_warmup = max(min(asked["warmup"], asked["start_step"] - now), 0)
        self.window_active = asked["steps"] - max(now - asked["start_step"], 0)
        self.finished, self.status = False, None
        self.cap = self._memory_cap()
        return now

    def record(self) -> StepRecord | None:
        """The rank's step record (rankside_record), made on first use: by then the process
        is a rank of the job (a launcher or agent that imports the framework makes no call).
        None where it cannot be made (said once)."""
        if self._step_record is not None or self._step_record_failed:
            return self._step_record
        with self.lock:
            if self._step_record is None and not self._step_record_failed:
                try:
                    info = self._rank()
                    folder = rank_dir(self.config.run_dir, info.rank)
                    self._step_record = StepRecord(folder, self.config.stall_s)
                    self._step_record.watch()
                except Taken:  # (a process the rank started: the rank keeps the record)
                    self._step_record_failed = True
                except OSError:  # (a run directory it cannot write: the profile says so)
                    self._step_record_failed = True
                except Exception as exc:  # never break the job
                    self._step_record_failed = True
                    warn(f"step record not kept ({type(exc).__name__}: {exc})")
        return self._step_record

    def record_step_end(self) -> None:
        """A step of the job ended: its row in the step record (every step, profiled or not)."""
        record = self.record()
        if record is not None:
            record.step_end()

    def mark_phase(self, owner: Any, name: str, phase: int, depth: local | None = None) -> None:
        """In the step record: each call of ``owner.name`` is phase ``phase`` (``IO_PHASE``,
        ``CHECKPOINT_PHASE``), always (not only in the profiled window); the outermost call only,
        of it or of the methods sharing ``depth``. Nothing where ``owner`` has no ``name``."""
        original = getattr(owner, name, None)
        if original is None:
            return
        calls = depth if depth is not None else local()

        def marked(*args: Any, **kwargs: Any) -> Any:
            record = self.record() if not getattr(calls, "level", 0) else None
            if record is None:
                return original(*args, **kwargs)
            left = record.phase(phase)
            calls.level = 1
            try:
                return original(*args, **kwargs)
            except _ENDS:
                raise
            except BaseException:
                record.raised_in(phase)
                raise
            finally:
                calls.level = 0
                record.restore(left)

        replace(owner, name, marked, original)

    def mark_collective(
        self,
        owner: Any,
        name: str,
        op: str,
        group: Callable[[Any], str],
        flags: int = 0,
        depth: local | None = None,
    ) -> None:
        """In the step record: each call of ``owner.name`` (a method) is a call ``op`` in the
        process group ``group(instance)`` names, always; ``flags``: ``ASYNC`` where the call
        only enqueues the transfer. The outermost of nested calls only (of it, or of the methods
        sharing ``depth``: an all-reduce of a model made of all-reduces of arrays)."""
        original = getattr(owner, name, None)
        if original is None:
            return
        index, p2p = op_index(op), op in ("send", "recv")
        calls = depth if depth is not None else local()

        def recorded(instance: Any, *args: Any, **kwargs: Any) -> Any:
            record = self.record() if not getattr(calls, "level", 0) else None
            if record is None:
                return original(instance, *args, **kwargs)
            slot = record.call_begin(index, record.group(group(instance)), _nbytes(args), p2p)
            calls.level = 1
            try:
                result = original(instance, *args, **kwargs)
            except BaseException:
                record.call_end(slot, flags | FAILED)
                raise
            finally:
                calls.level = 0
            record.call_end(slot, flags)
            return result

        replace(owner, name, recorded, original)

    # what each framework does --------------------------------------------------------------

    @abc.abstractmethod
    def _hook(self) -> None:
        """Hook the framework, so that its steps reach this collector."""

    @abc.abstractmethod
    def manual_step(self) -> None:
        """The end of a step, marked by the script (``traceview.collectors.step()``)."""

    @abc.abstractmethod
    def phase(self, name: str) -> AbstractContextManager[None]:
        """A region ``## name ##`` of the step (``traceview.collectors.phase(name)``)."""

    @abc.abstractmethod
    def _framework_version(self) -> str: ...

    @abc.abstractmethod
    def _stop_for_memory(self) -> None:
        """Past the memory cap: stop the profile (on the thread ``_memory_cap`` says)."""

    @abc.abstractmethod
    def _end_profile(self, at_exit: bool) -> None:
        """Under the lock, from ``finish``: stop the profile and write what it recorded (once;
        ``finished`` is set from here on)."""

    def _drop_profile(self) -> None:  # noqa: B027 (optional)
        """Under the lock, from ``abandon``: stop recording, writing nothing."""

    def _nothing_recorded(self, state: str | None) -> None:  # noqa: B027 (optional)
        """``finish`` found no status: the profile never started."""

    def _rank(self) -> RankInfo:
        """This process's place in the job (a framework may know better than the launcher)."""
        return detect_rank(os.environ)

    def _memory_cap(self) -> MemoryCap:
        """The profile's memory cap: past it, ``_stop_for_memory`` runs on the training thread
        (the main one interrupted; other threads at their next step)."""
        return MemoryCap(self.config.max_memory, self._stop_for_memory)

    # the lifecycle ---------------------------------------------------------------------------

    def install(self) -> None:
        self._hook()
        install_exit_handlers(self)
        register(self)

    def _new_status(self) -> Status:
        """The rank's status as its profile starts."""
        info = self._rank()
        status = Status(info.rank, info.world_size, info.local_rank, info.source)
        status.framework, status.framework_version = self.framework, self._framework_version()
        status.clock = asdict(probe_clock(self.config.clock))
        status.window = self.window
        return status

    def _stopped_early(self, step: int, mid_step: bool = False) -> None:
        """Record and say that the memory cap stopped the profile at ``step`` (the profiler's
        number; ``mid_step``: that step was cut short, and is left out)."""
        reason = self.cap.reason
        if self.status is not None:
            self.status.stop_reason, self.status.stop_step = reason, step
            self.status.stop_mid_step = mid_step
        warn(f"profile stopped at step {step}: {reason}; the job runs on unprofiled")

    def finish(self, state: str | None = None, detail: str | None = None) -> None:
        """Stop profiling (writing what was recorded) and leave the job alone from now on.

        ``state`` records how the process ends (ok, exception, signal) when called at exit;
        None when only the profiling window is over.
        """
        with self.lock:
            self._end_profile(at_exit=state is not None)
            status = self.status
            if status is None:
                self._nothing_recorded(state)
                return  # never profiled: nothing to report (an agent, a data-loader worker)
            if state is not None and status.ended_ns is None:
                status.state, status.detail = state, detail
                status.ended_ns = time.time_ns()
            elif status.state == "profiling":
                status.state = "running"  # the window is over; the process goes on
            self.write_status()

    def abandon(self, reason: str) -> None:
        """traceview's own code failed: drop the profile, say why in the status, and leave
        the job alone."""
        with self.lock:
            self.finished = True
            self.cap.close()
            self._drop_profile()
            if self.status is not None:
                self.status.notes.append(f"profiling stopped: {reason}")
                self.write_status()

    def _failed(self, exc: Exception) -> None:
        """A failure inside one of traceview's hooks: one line on stderr, then ``abandon``."""
        warn(f"profiling stopped ({type(exc).__name__}: {exc}); the job runs on")
        self.abandon(f"{type(exc).__name__}: {exc}")

    def write_status(self) -> None:
        """Write the status, if any, never raising."""
        if self.status is not None:
            with contextlib.suppress(Exception):
                self.status.write(self.window_dir())


#: The pacer of the steps the script marks itself (traceview.collectors.step()).
_USER_STEPS = object()


class PacedCollector(Collector):
    """A collector whose steps end where one object's update returns (the first trainer or
    optimizer that updates: ``after_step(owner)``), or, once the script marks steps itself,
    where ``traceview.collectors.step()`` returns."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.pacer: int | None = None  # id() of the object whose updates end the steps
        self.steps_seen = 0

    @abc.abstractmethod
    def _paced_step(self, owner: Any) -> None:
        """Under the lock: a step of the pacer ended, before the window's end."""

    @abc.abstractmethod
    def _step_after_window(self) -> None:
        """Under the lock: a step of the pacer ended after the window (its timing is not
        recorded): do what the window's end left for it."""

    def manual_step(self) -> None:
        """The end of a step, marked by the script: from the first call on, these pace the
        steps and the framework's updates no longer count."""
        with self.lock:
            self.pacer = id(_USER_STEPS)
        self.after_step(_USER_STEPS)

    def after_step(self, owner: Any) -> None:
        with self.lock:
            if self.pacer is None:
                self.pacer = id(owner)
            if id(owner) != self.pacer:  # several: the first one paces the steps
                return
            self._paced_step_known(owner)
            self.record_step_end()
            if self.finished:
                self._step_after_window()
            else:
                self._paced_step(owner)

    def _paced_step_known(self, owner: Any) -> None:
        """Under the lock, before the step record's row: what the pacer tells of the rank (an
        MXNet trainer, its KVStore and so its rank)."""


# --- hooking the framework's classes ------------------------------------------------------------


def replace(owner: Any, name: str, wrapped: Callable[..., Any], original: Any) -> None:
    """Put ``wrapped`` in the place of ``owner.name`` (``original``), marked as traceview's
    (``__traceview__``) and as wrapping ``original`` (``__wrapped__``, its docstring)."""
    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    wrapped.__doc__ = getattr(original, "__doc__", None)
    wrapped.__traceview__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapped)


class _Recording(Protocol):
    recording: bool


T = TypeVar("T")


def mark_calls(
    owner: Any,
    name: str,
    collector: _Recording,
    begin: Callable[[int], T],
    end: Callable[[T], None],
    depth: local | None = None,
) -> None:
    """While ``collector.recording``: ``begin(level)`` before each call of ``owner.name`` and
    ``end(what begin returned)`` after it, where ``level`` counts the calls it runs inside (of
    it, or of the methods sharing ``depth``: 0 for the outermost). Nothing where ``owner`` has
    no ``name``."""
    original = getattr(owner, name, None)
    if original is None:
        return
    calls = depth if depth is not None else local()

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not collector.recording:
            return original(*args, **kwargs)
        level = getattr(calls, "level", 0)
        began = begin(level)
        calls.level = level + 1
        try:
            return original(*args, **kwargs)
        finally:
            calls.level = level
            end(began)

    replace(owner, name, wrapped, original)


def every_subclass(base: Any, mark: Callable[[Any], None]) -> None:
    """``mark(cls)`` for ``base`` and each of its subclasses, those defined later too."""
    pending = [base]
    while pending:
        cls = pending.pop()
        mark(cls)
        pending.extend(cls.__subclasses__())
    previous = base.__dict__.get("__init_subclass__")

    def init_subclass(cls: Any, **kwargs: Any) -> None:
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        with contextlib.suppress(Exception):
            mark(cls)

    base.__init_subclass__ = classmethod(init_subclass)


#: How an iterator ends (not a failure of the phase it was in)
_ENDS = (StopIteration, StopAsyncIteration, GeneratorExit)


def _nbytes(args: tuple[Any, ...]) -> int:
    """The bytes of a call's first argument, where it is an array (0 where not known)."""
    value = getattr(args[0], "nbytes", 0) if args else 0
    return value if isinstance(value, int) else 0
