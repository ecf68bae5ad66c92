"""All-to-alls (issue 32's expert parallelism) on a real 3-rank gloo job whose split sizes are
chosen by the job (tests/workloads/parallel/alltoall.py): bytes sent per rank and the imbalance
of the splits, worked out from the job's own arguments."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli, run_job, run_process

pytestmark = [pytest.mark.torch]

JOB = REPO / "tests" / "workloads" / "parallel" / "alltoall.py"
RANKS, STEPS, ROW_BYTES = 3, 4, 64 * 4


def test_alltoall_bytes_and_split_imbalance_per_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU build)")
    sys.path.insert(0, str(JOB.parent))
    from alltoall import splits  # the job's own split sizes

    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv = [*launcher, "--nproc-per-node", RANKS, JOB, tmp_path, "--steps", STEPS]
    done = run_job(lambda: run_process(argv, timeout=300), tmp_path)
    assert done.code == 0, done.err[-2000:]
    result = run_cli("report", tmp_path, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    rows = {r["rank"]: r for r in report["alltoall"]}
    assert sorted(rows) == list(range(RANKS))
    for rank, row in rows.items():
        sent, received = splits(rank, RANKS)
        # max over mean of the splits, the larger of the sent and the received ones
        imbalance = max(max(s) * len(s) / sum(s) for s in (sent, received))
        print(f"rank {rank}: {row}")
        assert row["calls_per_step"] == 1.0
        assert row["bytes_per_step"] == sum(sent) * ROW_BYTES
        assert row["split_imbalance"] == pytest.approx(imbalance, abs=1e-3)
        # an even split of the same bytes would move in transfer / imbalance
        assert row["imbalance_ms"] == pytest.approx(
            row["transfer_ms"] * (1 - 1 / imbalance), abs=2e-3
        )
