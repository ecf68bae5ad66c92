"""What `traceview collect` runs inside a JAX process (standard library only).

Loaded from the bootstrap package beside the runtime (``rankside.py``), which calls
``start(config, jax)`` right after the job imports ``jax``. One JAX process drives all of its
host's devices; its profile (one XSpace) is read as one rank per device by ``ingest``.

Steps are found without touching the script: ``jax.jit`` and ``jax.pmap`` are wrapped so that
the functions they compile count their calls, and the first compiled function called a second
time is taken for the training step (a loop's body calls its step function once an iteration;
so does any helper it compiles once an iteration). Each of its calls begins a step, which ends
at the next one; the user API (``traceview.collectors.step()``) overrides. The profile is the
TensorFlow collector's lifecycle with JAX's profiler (``jax.profiler.start_trace``, steps marked
with ``StepTraceAnnotation("train", step_num=N)``): the same skip, warm-up and window, the
XSpace moved to ``RUN/raw/rank-NNNNN/<host>.xplane.pb``.

A process that imports TensorFlow is TensorFlow's (its collector profiles it; Keras 3 imports
JAX itself where it is installed); a JAX job that imports TensorFlow later (tf.data) stays
JAX's: one profiler session per process.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from .rankside import Config, RankInfo, _collectors, detect_rank
from .rankside_tensorflow import TensorFlowCollector


class _Profiler:
    """``tf.profiler.experimental`` as the TensorFlow collector calls it, with JAX's profiler."""

    def __init__(self, jax: Any):
        self.jax = jax

    def start(self, logdir: str) -> None:
        self.jax.profiler.start_trace(logdir)

    def stop(self) -> None:
        self.jax.profiler.stop_trace()

    def Trace(self, name: str, step_num: int | None = None, **_: Any) -> Any:
        if step_num is None:
            return self.jax.profiler.TraceAnnotation(name)
        return self.jax.profiler.StepTraceAnnotation(name, step_num=step_num)


class _Counted:
    """A compiled function whose calls are counted; everything else is the function's."""

    def __init__(self, function: Any, on_call: Callable[[int], None]):
        self.__wrapped__ = function
        self._on_call = on_call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # (never break the job)
            self._on_call(id(self))
        return self.__wrapped__(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


class JaxCollector(TensorFlowCollector):
    framework = "jax"

    def __init__(self, config: Config, jax: Any):
        super().__init__(
            config, SimpleNamespace(profiler=SimpleNamespace(experimental=_Profiler(jax)))
        )
        self.jax = jax
        self.calls: dict[int, int] = {}
        self.step_function: int | None = None

    def _framework_version(self) -> str:
        return str(self.jax.__version__)

    def _rank(self) -> RankInfo:
        return detect_rank(os.environ)

    def _hook(self) -> None:
        """``jax.jit`` and ``jax.pmap`` hand back functions whose calls are counted."""
        for name in ("jit", "pmap"):
            original = getattr(self.jax, name, None)
            if original is None:
                continue
            setattr(self.jax, name, self._counting(original))

    def _counting(self, compile_: Callable[..., Any]) -> Callable[..., Any]:
        def compiled(*args: Any, **kwargs: Any) -> Any:
            result = compile_(*args, **kwargs)
            if args and callable(args[0]) and callable(result):
                return _Counted(result, self.called)
            return result

        compiled.__wrapped__ = compile_  # type: ignore[attr-defined]
        return compiled

    def called(self, function: int) -> None:
        """A compiled function was called: the step function's calls begin steps."""
        calls = self.calls[function] = self.calls.get(function, 0) + 1
        if self.step_function is None and calls == 2:
            self.step_function = function
            self._first_step_passed()
        if function == self.step_function:
            self.boundary("iterator")  # (the TensorFlow collector's automatic source)

    def _first_step_passed(self) -> None:
        """The step function is known at its second call: its first began the job's step 0,
        unseen. Steps are counted from 1 on, so that they carry the job's own numbers (the
        step record has no row of step 0)."""
        with self.lock:
            self.begun = max(self.begun, 1)
            record = self.record()
            if record is not None:
                with record.lock:
                    record.step = max(record.step, 1)
                    record._head()


def start(config: Config, jax: Any) -> None:
    """Called by the runtime once the job has imported jax; not in a process that imports
    TensorFlow, whose collector profiles it (TensorFlow 2.21 with Keras 3 imports JAX itself
    where it is installed: the job is TensorFlow's)."""
    if "tensorflow" in sys.modules or any(c.framework == "tensorflow" for c in _collectors):
        return  # (one profiler session per process)
    JaxCollector(config, jax).install()
