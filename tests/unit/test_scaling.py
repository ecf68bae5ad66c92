"""`traceview scaling` on real 1-, 2- and 4-rank runs of one DDP job, against their timers.

sample_traces/pytorch/scaling/ranks-N holds the same DDP/gloo job (make_traces.py ddp) run with
N ranks under mpirun; each folder's groundtruth.json has perf_counter timers for every step, the
per-rank batch size and the model's gradient bytes. The expectations below come from those
timers and from the definitions in docs/design.md, never from traceview's own output.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import SAMPLES
from traceview.analysis.attribution import CommSchedule, comm_schedule, layerwise_exposed
from traceview.runs import open_run


def test_comm_schedule_tells_overlapped_from_exposed_collectives() -> None:
    """DDP issues its first buckets during backward; explicit all_reduce after it."""
    with (
        open_run([SAMPLES / "pytorch" / "ddp"]) as ddp,
        open_run([SAMPLES / "pytorch" / "explicit"]) as explicit,
    ):
        ddp_schedules = comm_schedule(ddp.events([0]))
        explicit_schedules = comm_schedule(explicit.events([0]))
    assert ddp_schedules and explicit_schedules
    for s in ddp_schedules:
        assert s.ready[0] < 0.8 and s.weight.sum() == pytest.approx(1.0)
    for s in explicit_schedules:
        assert (s.ready > 0.99).all() and s.weight.sum() == pytest.approx(1.0)


def test_layerwise_exposed_by_hand() -> None:
    # backward 10 ms; 2 ms at half of it and 2 ms at its end: the first hides, the second not
    schedule = CommSchedule(0, np.array([0.5, 1.0]), np.array([0.5, 0.5]))
    assert layerwise_exposed(schedule, 10.0, 4.0) == pytest.approx(2.0)
    # 12 ms issued at the start: backward hides 10 of it
    assert layerwise_exposed(
        CommSchedule(0, np.array([0.0]), np.array([1.0])), 10.0, 12.0
    ) == pytest.approx(2.0)
    # collectives queue behind each other: 3 x 4 ms from 60% of a 10 ms backward end at 18 ms
    queued = CommSchedule(0, np.array([0.6, 0.6, 0.6]), np.full(3, 1 / 3))
    assert layerwise_exposed(queued, 10.0, 12.0) == pytest.approx(8.0)
