"""A TensorFlow parameter-server task's role from its profile's events (parsers/tf_roles.py), on
hand-made events laid out as the profiles of a real job show them (tests/live/
test_tf_parameter_server.py runs the job): which task, a worker's steps as the work inside each
execution, its waits for other tasks' tensors as communication."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from traceview.parsers import raw_events
from traceview.parsers.tf_roles import REMOTE_TID, remote_waits, task_role

MS = 1_000_000
CALLER, COMPUTE, QUEUE = 11, 22, 33


def _events(*rows: tuple[str, str, int, float, float]) -> pa.Table:
    """(cat, name, tid, start ms, dur ms) rows as raw events of one process."""
    cats, names, tids, ts, dur = zip(*rows, strict=True)
    return raw_events(
        list(cats), list(names), [7] * len(rows), list(tids),
        pa.array([round(t * MS) for t in ts], pa.int64()),
        pa.array([round(d * MS) for d in dur], pa.int64()),
    )  # fmt: skip


def _worker_step(at: float) -> list[tuple[str, str, int, float, float]]:
    """One closure on a worker: the eager service's call (10 ms) on the calling thread, its
    executors' work from 1 to 8 ms inside it on two other threads."""
    return [
        ("tf_host", "EagerService:Enqueue", CALLER, at - 0.1, 10.2),
        ("tf_host", "EagerLocalExecute: __inference_step_42", CALLER, at, 10.0),
        ("tf_host", "KernelAndDeviceFunc::Run", CALLER, at + 0.1, 9.8),
        ("tf_op", "MatMul:_MklMatMul", COMPUTE, at + 1.0, 3.0),
        ("tf_host", "ExecutorState::ProcessAsync::Done", QUEUE, at + 4.5, 0.1),
        ("tf_op", "gradient_tape/MatMul/MatMul:_MklMatMul", COMPUTE, at + 5.0, 3.0),
    ]


def test_a_worker_runs_the_closures_it_is_handed_and_each_is_a_step() -> None:
    events = _events(*_worker_step(0.0), *_worker_step(30.0), *_worker_step(45.0))
    found = task_role(events)
    assert found is not None and found.role == "worker"
    assert found.function == "__inference_step_42"
    assert found.figures == {"executions": 3}
    # the work inside each execution: its executors' first event (1 ms in) to their last (8 ms)
    assert (found.start == np.array([1.0, 31.0, 46.0]) * MS).all()
    assert (found.dur == np.full(3, 7 * MS)).all()


def test_a_parameter_server_runs_only_partitions_and_the_chief_only_dispatches() -> None:
    server = _events(
        ("tf_host", "EagerService:Enqueue", CALLER, 0.0, 2.0),
        ("tf_host", "EagerLocalExecuteAsync: __inference_step_42_partitioned_123_0", CALLER, 0.1, 1.5),
        ("tf_op", "AssignVariableOp:AssignVariableOp", COMPUTE, 0.5, 0.2),
    )  # fmt: skip
    found = task_role(server)
    assert found is not None and found.role == "server" and found.figures == {"partitions": 1}
    chief = _events(
        *[("tf_host", "TFE_Py_ExecuteCancelable", 100 + k % 2, 10.0 * k, 8.0) for k in range(6)],
        ("tf_host", "EagerLocalExecute: Identity", 100, 1.0, 0.1),
    )
    found = task_role(chief)
    assert found is not None and found.role == "chief"
    assert found.figures == {"dispatched": 6, "threads": 2}


def test_an_ordinary_tensorflow_program_is_no_task_of_such_a_job() -> None:
    """A program that calls its own functions and runs their operators itself (an eager loop, a
    MirroredStrategy worker) has no role: it is read as before."""
    local = _events(
        *[("tf_host", "TFE_Py_ExecuteCancelable", CALLER, 10.0 * k, 8.0) for k in range(4)],
        *[("tf_host", "EagerLocalExecute: __inference_train_7", CALLER, 10.0 * k, 8.0)
          for k in range(4)],
        ("tf_op", "MatMul:_MklMatMul", COMPUTE, 1.0, 3.0),
    )  # fmt: skip
    assert task_role(local) is None


def test_the_waits_for_other_tasks_tensors_pair_start_and_end_and_merge() -> None:
    """Three _Recv: two overlapping (one wait, 1 to 6 ms), one alone (9 to 9.5 ms); a start
    without its end is not a wait."""
    keys = ["s1/a", "s1/b", "s1/a", "s1/b", "s1/c", "s1/c", "s1/lost"]
    done = [False, False, True, True, False, True, False]
    ts = np.array([1.0, 2.0, 5.9, 4.0, 9.0, 9.4, 3.0]) * MS
    dur = np.array([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]) * MS
    waits = remote_waits((keys, done, [7] * 7, ts.astype(np.int64), dur.astype(np.int64)))
    assert waits is not None
    assert waits.column("tid").to_pylist() == [REMOTE_TID, REMOTE_TID]
    assert waits.column("ts_ns").to_pylist() == [1 * MS, 9 * MS]
    assert waits.column("dur_ns").to_pylist() == [5 * MS, MS // 2]
    assert waits.column("name").to_pylist()[0].startswith("_Recv (2 ")
    assert remote_waits(None) is None


def test_a_parameter_server_task_is_known_by_its_tf_config() -> None:
    """collect's TensorFlow collector takes a task of a cluster with parameter servers as such
    (chief, worker, ps); a MultiWorkerMirroredStrategy worker, an evaluator and a config that
    does not read are not."""
    import json

    from traceview.collectors.rankside_tf_ps import parameter_server_task

    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    for kind, index in (("chief", 0), ("worker", 1), ("ps", 0)):
        said = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        assert parameter_server_task(said) == (kind, index, cluster)
    mirrored = {"cluster": {"worker": ["h:2", "h:3"]}, "task": {"type": "worker", "index": 0}}
    evaluator = {"cluster": cluster, "task": {"type": "evaluator", "index": 0}}
    for value in (json.dumps(mirrored), json.dumps(evaluator), "{", "[]", None, '{"task": 1}'):
        assert parameter_server_task(value) is None
