"""`traceview collect`: real jobs, real launchers (Open MPI's mpirun, torchrun), no mocks.

The training scripts in tests/workloads know nothing of traceview, except manual_steps.py,
which uses its small step/phase API on purpose.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests import collect_faults as F
from traceview.collectors import rankside
from traceview.collectors.launch import (
    CollectSettings,
    JobResult,
    _StderrTail,
    collect_manifest,
    read_statuses,
)

pytestmark = pytest.mark.mpi


def _tail_of(*lines: str) -> list[str]:
    """What collect would quote of a job whose stderr is ``lines``, passed through a real pipe."""
    read, write = os.pipe()
    with open(write, "wb") as out:
        out.write("".join(f"{line}\n" for line in lines).encode())
    with open(read, "rb") as stream:
        tail = _StderrTail(stream)
        tail.run()  # reads to the end of the pipe (and passes it through to our stderr)
    return tail.summary()


def test_the_quoted_stderr_line_is_the_job_s_not_the_collector_s() -> None:
    # the collector's own line is on the screen already: quoting it under the verdict repeated it
    said = _tail_of("epoch 1", "traceview: the job never stepped a Chainer optimizer")
    assert said == ["epoch 1"]
    assert _tail_of("traceview: only the collector spoke") == []
    # Open MPI's framed message is still quoted from its first line
    framed = _tail_of("-" * 10, "prterun has detected an attempt to run as root.", "more", "-" * 10)
    assert framed[0] == "prterun has detected an attempt to run as root."


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            },
            (3, 8, 1, "OMPI_COMM_WORLD_RANK"),
        ),
        ({"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2"}, (5, 6, 2, "PMI_RANK")),
        ({"PMIX_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, (2, 4, 0, "PMIX_RANK")),
        (
            {"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3"},
            (7, 16, 3, "SLURM_PROCID"),
        ),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2, 1, "RANK")),
        (
            {
                "MV2_COMM_WORLD_RANK": "4",
                "MV2_COMM_WORLD_SIZE": "9",
                "MV2_COMM_WORLD_LOCAL_RANK": "0",
            },
            (4, 9, 0, "MV2_COMM_WORLD_RANK"),
        ),
        # torchrun under srun: the worker's own RANK wins over the Slurm task id
        (
            {
                "RANK": "6",
                "WORLD_SIZE": "8",
                "LOCAL_RANK": "2",
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "2",
            },
            (6, 8, 2, "RANK"),
        ),
        ({}, (0, 1, 0, "default")),
    ],
)
def test_rank_from_each_launchers_environment(env: dict[str, str], expected: tuple) -> None:
    info = rankside.detect_rank(env)
    assert (info.rank, info.world_size, info.local_rank, info.source) == expected


def test_another_thread_has_the_main_thread_run_the_stop() -> None:
    """What the memory watch does past the cap, in this very process: a poke from another
    thread runs the callback on the main thread at its next bytecode (a simulated signal);
    disarmed, the signal is back at its default."""
    ran: list[str] = []
    poke = rankside.arm_main_thread(lambda: ran.append(threading.current_thread().name))
    assert poke is not None and rankside.STOP_SIGNAL is not None
    try:
        thread = threading.Thread(target=poke, name="watch")
        thread.start()
        thread.join()
        deadline = time.monotonic() + 5
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ran == ["MainThread"]
    finally:
        rankside.disarm_main_thread(poke)
    assert signal.getsignal(rankside.STOP_SIGNAL) == signal.SIG_DFL


@pytest.mark.parametrize("name", sorted(F.STATUSES))
def test_a_hostile_status_is_read_field_by_field(name: str, tmp_path: Path) -> None:
    """The statuses of tests/collect_faults.py's corpus, read as collect reads them: never an
    exception, what reads kept (rank 0 whole), what does not named by its file; and a
    parameter server's rank -1 is no problem."""
    rankside.Status(0, 2, 0, "RANK").write(tmp_path)
    server = rankside.Status(-1, 2, 0, "DMLC_ROLE")
    server.role = "server"
    server.write_to(tmp_path / "raw" / "server-0")
    folder = tmp_path / "raw" / "rank-00001"
    folder.mkdir()
    make = F.STATUSES[name]
    if make is None:
        os.mkfifo(folder / "status.json")
    else:
        (folder / "status.json").write_bytes(make(os.getpid()))
    warnings: list[str] = []
    statuses = read_statuses(tmp_path, warnings)
    by_folder = {s["folder"]: s for s in statuses}
    assert by_folder["rank-00000"]["rank"] == 0 and by_folder["rank-00000"]["world_size"] == 2
    assert by_folder["server-0"]["role"] == "server"
    assert all(w.startswith("raw/rank-00001/status.json: ") for w in warnings), warnings
    if "rank-00001" in by_folder:
        assert by_folder["rank-00001"]["rank"] == 1
    collect_manifest(JobResult([], [], 0, 0.0, 0.0, statuses=statuses), CollectSettings())
