"""`traceview collect` on real TensorFlow jobs: MultiWorkerMirroredStrategy under mpirun, Keras fit.

tests/workloads/tf_train.py knows nothing of traceview; steps are found from its tf.data
iterator (custom loop) or Keras' batches (fit).

TensorFlow 2.21's profiler sometimes breaks a multi-worker job while it stops: about 1 stop in 10
here, a worker aborts ("double free or corruption") or hangs inside
``tf.profiler.experimental.stop()`` (gdb: ``TraceMeRecorder::Consume`` →
``SplitEventTracker::FindStartAndMerge`` → ``free``; reading the source, the likely cause is
that the recorder keeps pointers into per-thread deques that its result vector copies when it
grows). traceview cannot prevent it; the status
says where the worker died. These tests run such a job again, up to 3 times, when that happened
(and only then), and say so.
"""

from __future__ import annotations

import json

import pytest

from traceview.collectors.rankside_tensorflow import rank_from_tf_config

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}, (1, 2)),
        (
            {
                "cluster": {"chief": ["c:1"], "worker": ["a:1", "b:1"]},
                "task": {"type": "worker", "index": 0},
            },
            (1, 3),
        ),
        (
            {
                "cluster": {"chief": ["c:1"], "worker": ["a:1"]},
                "task": {"type": "chief", "index": 0},
            },
            (0, 2),
        ),
        ({"cluster": {"ps": ["p:1"], "worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}, None),
    ],
)
def test_rank_from_tf_config(config: dict, expected: tuple[int, int] | None) -> None:
    assert rank_from_tf_config(json.dumps(config)) == expected
    assert rank_from_tf_config("not json") is None and rank_from_tf_config(None) is None
