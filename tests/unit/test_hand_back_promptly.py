"""Polars' allocator told to hand freed pages back at once where a command reads a large trace
(``trim.hand_back_promptly``): which traces count as large, and that the setting is made
before polars is loaded and never over the user's."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from traceview.ingest.large import trim

REPO = Path(__file__).resolve().parents[2]


def test_the_largest_trace_counts_a_gzip_file_eight_times(tmp_path: Path) -> None:
    plain = tmp_path / "rank0.json"
    plain.write_bytes(b"x" * 1_000)
    packed = tmp_path / "rank1.json.gz"
    packed.write_bytes(gzip.compress(os.urandom(300)))
    assert trim.largest_trace([plain]) == 1_000
    assert trim.largest_trace([packed]) == 8 * packed.stat().st_size
    assert trim.largest_trace([tmp_path]) == max(1_000, 8 * packed.stat().st_size)
    assert trim.largest_trace([tmp_path / "missing.json"]) == 0


def test_a_run_directory_counts_its_largest_ranks_trace(tmp_path: Path) -> None:
    ranks = [{"rank": r, "bytes_read": b} for r, b in enumerate([5_000, 900_000_000, 7])]
    (tmp_path / "manifest.json").write_text(json.dumps({"ranks": ranks}, indent=1))
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank0.parquet").write_bytes(b"x" * 10)
    assert trim.largest_trace([tmp_path]) == 900_000_000


def _ingest_in_a_fresh_process(trace: Path, out: Path, env: dict[str, str], lowest: int) -> str:
    code = (
        "import os, sys\n"
        "from traceview.ingest.large import trim\n"
        f"trim.PROMPT_FROM_BYTES = {lowest}\n"
        "from traceview.cli import main\n"
        f"code = main(['ingest', {str(trace)!r}, '-o', {str(out)!r}])\n"
        "assert code == 0, code\n"
        "print(os.environ.get(trim.POLARS_ALLOCATOR, '<unset>'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def test_a_large_trace_sets_it_before_polars_loads_and_a_users_setting_stands(
    tmp_path: Path,
) -> None:
    trace = REPO / "sample_traces" / "pytorch" / "ddp"
    env = {k: v for k, v in os.environ.items() if k != trim.POLARS_ALLOCATOR}
    # (polars puts its own setting first when it loads: what comes after it wins)
    at_once = ",dirty_decay_ms:0,muzzy_decay_ms:0"
    large = _ingest_in_a_fresh_process(trace, tmp_path / "a", env, lowest=1)
    assert large.endswith(at_once)
    small = _ingest_in_a_fresh_process(trace, tmp_path / "b", env, lowest=1 << 40)
    assert at_once not in small
    mine = {**env, trim.POLARS_ALLOCATOR: "dirty_decay_ms:5000"}
    theirs = _ingest_in_a_fresh_process(trace, tmp_path / "c", mine, lowest=1)
    assert theirs.endswith(",dirty_decay_ms:5000") and at_once not in theirs
