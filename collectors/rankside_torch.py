"""`traceview collect`'s PyTorch side, in every process of the job (standard library only).

Loaded from the bootstrap package beside the runtime (``rankside.py``), which calls ``start``
once the job has imported ``torch``. The collector registers a global optimizer-step hook; the
first optimizer step after ``--skip`` starts ``torch.profiler`` with the collection's schedule,
every later one advances it, and the trace is written to ``RUN/raw/rank-NNNNN/`` when the
schedule ends or the process exits. The script may mark steps and phases itself
(``traceview.collectors.step``/``phase``); a script that runs torch.profiler itself keeps it,
and its trace is copied into the run. The lifecycle is ``rankside_lifecycle.Collector``'s.

Nothing here may break the job: a failure prints one ``traceview:`` line and the job runs on.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import rankside_groups
from .rankside import (
    Config,
    RankInfo,
    detect_rank,
    rank_dir,
    sample_resident,
    warn,
    write_gzip,
)
from .rankside_lifecycle import Collector
from .rankside_record import CHECKPOINT_PHASE, IO_PHASE


def _trace_only(torch: Any) -> dict[str, Any]:
    """torch.profiler's ``trace_only`` where this torch has it: stopping then builds no Python
    event objects (which only ``events()``/``key_averages()`` need, never the trace). Stopping a
    profile of 550,000 events: +1.35 GiB and 2.9 s instead of +1.64 GiB and 3.7 s (torch 2.13)."""
    config_type = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if config_type is None:
        return {}
    try:
        return {"experimental_config": config_type(trace_only=True)}
    except TypeError:  # an older torch
        return {}


def give_back_memory() -> None:
    """Hand the memory freed by a stopped profile back to the system. Stopping takes several
    times what the profile recorded (1.35 GiB for 150 MiB recorded, freed once the profile
    object goes); glibc keeps freed memory, so without this the job carried it to its end."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).malloc_trim(0)


class TorchCollector(Collector):
    """Drives torch.profiler from a global optimizer-step hook (or from ``step()``)."""

    framework = "pytorch"

    def __init__(self, config: Config, torch: Any):
        super().__init__(config)
        self.torch = torch
        self.profiler: Any = None
        self.hook: Any = None
        self.stepping_optimizer: int | None = None  # id() of the optimizer that paces steps
        self.steps_seen = 0  # steps ended so far (the profiler is created after --skip of them)
        self.manual = False  # the script calls traceview's step() itself
        self.nvtx: NvtxPhases | None = None
        self.user_profilers = 0  # torch.profiler sessions the script itself has running
        self.busy = 0  # inside step() or finish() on some thread (a stop must wait for them)
        self.extra_step = 0  # a step the profiler has not counted: it ended at the stop
        self.thread: int | None = None  # the thread that started the profiler
        self.first_step = 0  # the job's step the profiler started in (its first: 0)

    def _framework_version(self) -> str:
        return str(self.torch.__version__)

    # the schedule ------------------------------------------------------------------------

    def _hook(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.hook = register_optimizer_step_post_hook(self._after_optimizer_step)
        self._watch_user_profilers()
        try:  # name each collective call's process group; each call in the step record
            rankside_groups.install(self.torch, self.record)
        except Exception as exc:  # never break the job
            warn(f"process groups not recorded: {exc}")
        try:
            self._mark_data_loading()
        except Exception as exc:  # never break the job
            warn(f"data loading not recorded: {exc}")
        if self.config.nvtx:
            self.nvtx = NvtxPhases.install(self.torch)

    def _mark_data_loading(self) -> None:
        """In the step record: each batch a DataLoader hands over is data loading (``io``),
        each ``torch.save`` a checkpoint."""
        from torch.utils.data import dataloader

        self.mark_phase(dataloader._BaseDataLoaderIter, "__next__", IO_PHASE)
        self.mark_phase(self.torch, "save", CHECKPOINT_PHASE)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.manual:
            return
        if self.stepping_optimizer is None:
            self.stepping_optimizer = id(optimizer)
        if id(optimizer) == self.stepping_optimizer:  # several optimizers: the first paces
            self.record_step_end()
            if not self.finished:
                self.step()
            else:
                self._window_asked()

    def manual_step(self) -> None:
        self.manual = True  # from now on optimizer steps no longer count
        self.record_step_end()
        if not self.finished:
            self.step()
        else:
            self._window_asked()

    def _window_asked(self) -> None:
        """After the window: one asked of the job (``traceview profile``) begins here once its
        start is reached; the profile starts as the first window's did."""
        asked = self.window_asked()
        if asked is None or self.user_profilers or (self.status and self.status.user_profiler):
            return  # (a script that profiles itself keeps its own windows)
        with self.lock:
            if not self.finished:
                return
            self.steps_seen = self.open_window(asked)
            self.profiler, self.extra_step = None, 0
            self.busy += 1
            try:
                self._start()
                self._sample_memory()
            except Exception as exc:
                self._failed(exc)
            finally:
                self.busy -= 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A ``record_function`` region, and an NVTX range when NVTX is on."""
        region = self.torch.profiler.record_function(f"## {name} ##")
        nvtx = self.nvtx
        if nvtx is not None:
            nvtx.nvtx.push_range(name, domain="traceview")
        with region:
            try:
                yield
            finally:
                if nvtx is not None:
                    nvtx.nvtx.pop_range(domain="traceview")

    def step(self) -> None:
        """End of a training step: count the skipped ones, then start and advance the profiler.

        Nothing of torch.profiler exists during the skipped steps, so they run as fast as
        without traceview.
        """
        with self.lock:
            if self.finished:
                return
            self.steps_seen += 1
            if self.steps_seen <= self.config.skip:
                return
            self.busy += 1
            try:
                if self.profiler is None:
                    self._start()
                    self._sample_memory()
                elif self.profiler is not False:
                    if self.cap.reached:  # past the memory cap: the step that ended is kept
                        self._stop_early(mid_step=False)
                        return
                    self._sample_memory()
                    self.profiler.step()
                    done = self.profiler.step_num - self.first_step
                    if done >= self.window_warmup + self.window_active:
                        self.finish()
            except Exception as exc:
                self._failed(exc)
            finally:
                self.busy -= 1

    def _sample_memory(self) -> None:
        """The process's resident memory at this step boundary, while the profile runs."""
        if self.profiler:
            sample_resident(self.status, self.config)

    def _stop_for_memory(self) -> None:
        """On the main thread, interrupted past the memory cap: stop inside the step (it is cut
        short, and left out); not while traceview's own step or finish runs on it."""
        with self.lock:
            if not self.busy:
                self._stop_early(mid_step=True)

    def _stop_early(self, mid_step: bool) -> None:
        """Stop the profile before its --steps (the memory cap): write what it has, say why in
        the status, and leave the job to run on unprofiled."""
        if self.finished or not self.profiler or self.status is None:
            return
        self.extra_step = 0 if mid_step else 1
        # the step in progress (mid_step) or the one that just ended
        self._stopped_early(int(self.profiler.step_num), mid_step)
        self.finish()

    def _start(self) -> None:
        torch = self.torch
        self.status = self._new_status()
        if self.user_profilers or _profiler_enabled(torch):
            # The script profiles on its own: keep its traces (see _watch_user_profilers).
            self.status.user_profiler = True
            self.status.notes.append("the script runs torch.profiler itself; its trace is kept")
            self.profiler = False
            self.status.write(self.window_dir())
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        window = torch.profiler.schedule(
            wait=0, warmup=self.window_warmup, active=self.window_active, repeat=1
        )
        # Steps carry the job's own numbers (its first step is 0, as in the step record): the
        # profiler counts from the step in progress, its schedule from the window's start.
        first = self.first_step = self.steps_seen

        def schedule(step: int) -> Any:
            return window(max(step - first, 0))

        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self._export,
            record_shapes=True,
            profile_memory=self.config.profile_memory,
            **_trace_only(torch),
        )
        self.profiler.step_num = first
        self.status.state = "profiling"
        self.status.first_step = first + self.window_warmup
        self.status.began_step = first
        self.status.write(self.window_dir())
        self.thread = threading.get_ident()
        self.cap.start()  # its thread starts before the profile, not inside a step of it
        self.profiler.start()
        if threading.current_thread() is not threading.main_thread():
            _thread_end.sentinel = _StopAtThreadEnd(self)

    def _rank(self) -> RankInfo:
        info = detect_rank(os.environ)
        with contextlib.suppress(Exception):
            dist = self.torch.distributed
            if dist.is_available() and dist.is_initialized():
                return RankInfo(
                    dist.get_rank(), dist.get_world_size(), info.local_rank, "torch.distributed"
                )
        return info

    def _export(self, profiler: Any) -> None:
        assert self.status is not None
        folder = rank_dir(self.window_dir(), self.status.rank)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank-{self.status.rank}.pt.trace.json.gz"
        plain = folder / f".{path.name}.{os.getpid()}.tmp.json"
        try:
            # Written plain, then compressed here: given a .gz path, torch compresses at level 9
            # line by line (12 s for a 212 MB trace, with the training thread waiting; 0.4 s here)
            profiler.export_chrome_trace(str(plain))
            write_gzip(plain, path)
        finally:
            with contextlib.suppress(OSError):
                plain.unlink()
        self.status.trace_files = [path.name]
        self.status.profiled_steps = max(
            profiler.step_num - self.first_step + self.extra_step - self.window_warmup, 0
        )

    def _end_profile(self, at_exit: bool) -> None:
        if self.finished:
            return
        # The hooks stay registered (removing one from inside a hook would change the dict
        # torch is iterating over); they return at once from now on.
        self.finished = True
        self.cap.close()
        if at_exit:
            self._past_cap("exit")
        if self.profiler and threading.get_ident() != self.thread:
            # torch.profiler stopped on another thread than the one that started it loses the
            # trace, or (that thread gone, at exit) crashes the process
            why = "torch.profiler can only be stopped on the thread that started it"
            warn(f"trace not written: {why}")
            if self.status is not None:
                self.status.notes.append(f"trace not written: {why}")
        elif self.profiler:
            try:
                self.profiler.stop()
            except Exception as exc:
                warn(f"could not write the trace ({type(exc).__name__}: {exc})")
                if self.status is not None:
                    self.status.notes.append(f"trace not written: {exc}")
            self.profiler = False
            give_back_memory()  # what stopping took, the job no longer carries

    def _past_cap(self, when: str) -> None:
        """Past the cap, but never stopped on the training thread until ``when``: say so."""
        status = self.status
        if self.cap.reached and self.profiler and status and status.stop_reason is None:
            status.stop_reason = f"{self.cap.reason}, stopped only at {when}"
            status.stop_step = int(self.profiler.step_num)
            status.stop_mid_step = True

    # scripts that profile on their own ------------------------------------------------------

    def _watch_user_profilers(self) -> None:
        """A script's own torch.profiler wins: ours steps aside, theirs is copied into the run."""
        profile_cls = self.torch.profiler.profile
        collector = self
        original_start = profile_cls.start
        original_export = profile_cls.export_chrome_trace

        original_stop = profile_cls.stop

        def start(profiler: Any) -> None:
            if profiler is not collector.profiler:
                collector.user_profilers += 1
                if collector.profiler:
                    collector._yield_to_user_profiler()
            original_start(profiler)

        def stop(profiler: Any) -> None:
            if profiler is not collector.profiler:
                collector.user_profilers = max(collector.user_profilers - 1, 0)
            original_stop(profiler)

        def export_chrome_trace(profiler: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            result = original_export(profiler, path, *args, **kwargs)
            if profiler is not collector.profiler:
                collector._keep_user_trace(Path(path))
            return result

        profile_cls.start = start
        profile_cls.stop = stop
        profile_cls.export_chrome_trace = export_chrome_trace

    def _yield_to_user_profiler(self) -> None:
        with self.lock:
            self.cap.close()
            profiler, self.profiler = self.profiler, False
            with contextlib.suppress(Exception):
                profiler.on_trace_ready = None
                profiler.stop()
            if self.status is not None:
                self.status.user_profiler = True
                self.status.notes.append(
                    "the script started torch.profiler itself; its trace is kept"
                )

    def _keep_user_trace(self, path: Path) -> None:
        with contextlib.suppress(Exception):
            if self.status is None:
                self.status = self._new_status()
                self.profiler = False
            self.status.user_profiler = True
            folder = rank_dir(self.config.run_dir, self.status.rank)
            folder.mkdir(parents=True, exist_ok=True)
            suffix = ".json.gz" if path.name.endswith(".gz") else ".json"
            target = folder / f"rank-{self.status.rank}.pt.trace{suffix}"
            for old in folder.glob("rank-*.pt.trace.json*"):
                old.unlink()  # one trace per rank: the script's latest export
            tmp = folder / f".{target.name}.{os.getpid()}.tmp"
            tmp.write_bytes(path.read_bytes())
            os.replace(tmp, target)
            self.status.trace_files = [target.name]
            self.status.write(self.config.run_dir)


#: Per thread: what a training thread that is not the main one does as it ends.
_thread_end = threading.local()


class _StopAtThreadEnd:
    """Kept in the training thread's thread-local storage, which Python clears on that thread
    as it ends: a profile still open then is stopped there, the only thread torch.profiler can
    be stopped on (left open, the process crashed at exit: SIGSEGV)."""

    def __init__(self, collector: TorchCollector):
        self.collector = collector

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            collector = self.collector
            if threading.get_ident() == collector.thread:
                with collector.lock:
                    collector._past_cap("the end of its thread")
                    collector.finish()


def _profiler_enabled(torch: Any) -> bool:
    with contextlib.suppress(Exception):
        return bool(torch.autograd.profiler._is_profiler_enabled)
    return False


class NvtxPhases:
    """NVTX ranges for the phases (data, forward, backward, optimizer), for Nsight Systems."""

    def __init__(self, nvtx: Any):
        self.nvtx = nvtx

    @classmethod
    def install(cls, torch: Any) -> NvtxPhases | None:
        try:
            import nvtx  # the NVIDIA nvtx package; absent: no ranges
        except ImportError:
            return None
        depth = threading.local()
        broken: list[bool] = []

        def push(name: str) -> None:
            if broken:
                return
            try:
                nvtx.push_range(name, domain="traceview")
            except Exception as exc:  # an NVTX problem must not reach the training loop
                broken.append(True)
                warn(f"NVTX ranges off ({type(exc).__name__}: {exc})")

        def pop() -> None:
            if broken:
                return
            try:
                nvtx.pop_range(domain="traceview")
            except Exception:
                broken.append(True)

        # forward: the outermost module call
        def forward_pre(module: Any, args: Any) -> None:
            level = getattr(depth, "forward", 0)
            depth.forward = level + 1
            if level == 0:
                push("forward")

        def forward_post(module: Any, args: Any, output: Any) -> None:
            depth.forward = getattr(depth, "forward", 1) - 1
            if depth.forward == 0:
                pop()

        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        nn_module.register_module_forward_pre_hook(forward_pre)
        nn_module.register_module_forward_hook(forward_post)
        optim_module.register_optimizer_step_pre_hook(lambda *a: push("optimizer"))
        optim_module.register_optimizer_step_post_hook(lambda *a: pop())

        # backward and data loading: wrap the calls
        def wrap(owner: Any, attr: str, name: str) -> None:
            original = getattr(owner, attr)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                push(name)
                try:
                    return original(*args, **kwargs)
                finally:
                    pop()

            setattr(owner, attr, wrapped)

        wrap(torch.autograd, "backward", "backward")
        from torch.utils.data import dataloader

        wrap(dataloader._BaseDataLoaderIter, "__next__", "data")
        return cls(nvtx)


def start(config: Config, torch: Any) -> None:
    """Called by the runtime once the job has imported torch."""
    TorchCollector(config, torch).install()
