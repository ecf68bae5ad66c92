"""The live tier runs a real job again once when one of its processes died (tests/conftest.py
``run_job``); a failure of any other kind must fail the test at once."""

from __future__ import annotations

from tests.conftest import Result, job_death

# torchrun's summary, as a CI run printed it when gloo aborted rank 1 of a three-rank job
TORCHRUN = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  [1]:
    rank      : 0 (local_rank: 0)
    exitcode  : -15 (pid: 25342)  (SIGTERM)
    traceback : Signal 15 (SIGTERM) received by PID 25342
  Root Cause (first observed failure):
  [0]:
    rank      : 1 (local_rank: 1)
    exitcode  : -6 (pid: 25343)  (SIGABRT)
    traceback : Signal 6 (SIGABRT) received by PID 25343
traceview: run directory /tmp/run (job exit code 1)
"""
MPIRUN = "mpirun noticed that process rank 1 with PID 0 on node x exited on signal 6 (Aborted).\n"


def test_a_process_killed_by_a_signal_or_a_lost_peer_is_a_death() -> None:
    why = job_death(Result(1, "", TORCHRUN))
    assert why is not None and "Signal 6 (SIGABRT) received by PID 25343" in why
    assert job_death(Result(134, "", MPIRUN)) is not None
    gloo = "terminate called after throwing an instance of 'gloo::IoException'\n  what():  [pair.cc] Connection reset by peer\n"
    assert "Connection reset by peer" in (job_death(Result(1, "", gloo)) or "")


def test_a_success_or_any_other_failure_is_not() -> None:
    assert job_death(Result(0, "", TORCHRUN)) is None  # a job that ended well
    sigterm_only = TORCHRUN.replace("Signal 6 (SIGABRT)", "Signal 15 (SIGTERM)")
    assert job_death(Result(1, "", sigterm_only)) is None  # stopped, not died: no rerun
    assert job_death(Result(1, "", MPIRUN.replace("signal 6 (Aborted)", "signal 15"))) is None
    # a rank that raised (the workload, or traceview's collector in it), which its peers then
    # lost: the failure is the exception, and it fails the test at once
    raised = (
        'Traceback (most recent call last):\n  File "ddp_train.py", line 80, in <module>\n'
        "[rank1]: RuntimeError: rank 1 fails on purpose at step 6\n"
        "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
        "terminate called after throwing an instance of 'gloo::IoException'\n"
    )
    assert job_death(Result(1, "", raised)) is None
    assert job_death(Result(1, "", TORCHRUN + raised)) is None
    # torchrun's own traceback of ChildFailedError, and a peer's lost connection, are not
    lost = "RuntimeError: [pair.cc:534] Read error: Connection reset by peer\n"
    assert job_death(Result(1, "", lost + TORCHRUN)) is not None
    for err in (
        "traceview: no such file: /tmp/x\n",
        "Traceback (most recent call last):\nAssertionError: step 3 timer missing\n",
        "traceview: run directory /tmp/run (job exit code 1)\n",
    ):
        assert job_death(Result(2, "", err)) is None
