"""DeepSpeed ZeRO's naming (issue 32): a real 2-rank ZeRO-3 job on CPU (gloo), profiled with
Python frames (tests/workloads/parallel/zero.py). DeepSpeed marks its hooks with NVTX ranges
only, so the phases come from its Python frames (parsers/rules/pytorch.toml): the layers'
parameters all-gathered in forward, the gradients reduce-scattered in backward, the gradient
norm all-reduced in the optimizer step. DeepSpeed also creates a second process group of the
whole world: groups of the same members are one for matching, so every call is matched."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli, run_job, run_process

pytestmark = [pytest.mark.torch]

JOB = REPO / "tests" / "workloads" / "parallel" / "zero.py"


def test_zero3_collectives_are_issued_in_their_phases(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="pip install deepspeed (DS_BUILD_OPS=0 is enough)")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv = [*launcher, "--nproc-per-node", 2, JOB, tmp_path, "--stage", 3, "--steps", 3]
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = run_job(lambda: run_process(argv, env=env, timeout=300), tmp_path)
    assert done.code == 0, done.err[-3000:]
    result = run_cli("report", tmp_path, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert not [w for w in report["warnings"] if "unmatched" in w or "counterpart" in w]
    by = {(c["phase"], c["op"]): c for c in report["comm_by_group"]}
    print(sorted(by))
    assert ("forward", "allgather") in by
    assert ("backward", "reduce_scatter") in by
    assert ("update", "allreduce") in by
    assert not [k for k in by if k[0] == "other"]
    assert by["backward", "reduce_scatter"]["calls_per_step"] >= 1
