"""Mark steps and phases yourself, for jobs run under ``traceview collect``.

``traceview collect`` needs no change to a training script: it advances the profiler at every
optimizer step. Scripts that step differently (a custom optimizer loop, no torch.optim, several
steps per optimizer step) or that want their own phase regions can say so::

    import traceview.collectors as tv

    for batch in loader:
        with tv.phase("data"):
            x, y = batch[0].to(device), batch[1].to(device)
        with tv.phase("forward"):
            loss = loss_fn(model(x), y)
        with tv.phase("backward"):
            loss.backward()
        with tv.phase("optimizer"):
            update(model)
        tv.step()  # the step ends here; from now on optimizer steps no longer count

``phase`` opens a profiler region named ``## <name> ##`` (the rules read forward, backward,
optimizer/update, data, h2d as those phases): under PyTorch a ``record_function`` and an NVTX
range for Nsight Systems, under TensorFlow a ``tf.profiler`` Trace, under MXNet an
``mx.profiler`` Task, under Chainer a region of the trace traceview's own collector writes. Outside ``traceview collect`` both functions do nothing, so the script runs
unchanged anywhere.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

#: The package under which the job's processes load the rank-side collectors (its ``__init__``
#: holds the runtime's entry points: install, current, step, phase; see launch.write_bootstrap).
RANKSIDE_MODULE = "_traceview_rankside"


def _rankside() -> Any:
    return sys.modules.get(RANKSIDE_MODULE)


def active() -> bool:
    """Whether this process runs under ``traceview collect`` with a collector armed."""
    module = _rankside()
    return module is not None and module.current() is not None


def step() -> None:
    """Mark the end of a training step (advances the profiler's schedule)."""
    module = _rankside()
    if module is not None:
        module.step()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark a phase of the step: ``data``, ``h2d``, ``forward``, ``backward``, ``optimizer``."""
    module = _rankside()
    if module is None:
        yield
        return
    with module.phase(name):
        yield
