"""DeepSpeed ZeRO's naming (issue 32): a real 2-rank ZeRO-3 job on CPU (gloo), profiled with
Python frames (tests/workloads/parallel/zero.py). DeepSpeed marks its hooks with NVTX ranges
only, so the phases come from its Python frames (parsers/rules/pytorch.toml): the layers'
parameters all-gathered in forward, the gradients reduce-scattered in backward, the gradient
norm all-reduced in the optimizer step. DeepSpeed also creates a second process group of the
whole world: groups of the same members are one for matching, so every call is matched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = [pytest.mark.torch]

JOB = REPO / "tests" / "workloads" / "parallel" / "zero.py"


def test_zero3_collectives_are_issued_in_their_phases(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="pip install deepspeed (DS_BUILD_OPS=0 is enough)")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*launcher, "--nproc-per-node", "2", str(JOB), str(tmp_path), "--stage", "3", "--steps", "3"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
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
