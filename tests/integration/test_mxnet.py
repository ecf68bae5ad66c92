"""The integration tier's part of ``tests/unit/test_mxnet.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import run_cli, shared_traces
from tests.unit.test_mxnet import MX_SAMPLES, SAMPLED, steps_with_timers
from traceview.model import schema as S
from traceview.parsers.mxnet import MXNetParser
from traceview.runs import ingest_run
from traceview.store import rundir as R


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mxnet")
    return {s: ingest_run([MX_SAMPLES / s], out / s) for s in SAMPLED}


def test_parameter_server_push_pull_is_communication(samples: dict[str, Path]) -> None:
    run = samples["dist_sync"]
    df = steps_with_timers(run, MX_SAMPLES / "dist_sync")
    # Trainer.step is one push/pull round (the server runs the optimizer): all of it is comm,
    # none hidden (the script waits for backward before it pushes), and nothing is update.
    assert (df["comm_tv"] > 0.5 * df["comm_ms"]).all()
    assert (df["comm_hidden_fraction"] < 0.05).all()
    assert (df["update_tv"] == 0).all()
    events = pl.from_arrow(R.read_events(run))
    assert isinstance(events, pl.DataFrame)
    kvstore = events.filter(pl.col(S.NAME).cast(pl.String).str.starts_with("KVStoreDist"))
    assert kvstore.height > 0
    assert set(kvstore[S.PHASE].cast(pl.String)) == {S.COMM}
    assert set(kvstore[S.COLLECTIVE].cast(pl.String)) <= {"push", "pull"}
    assert set(kvstore[S.OP].cast(pl.String)) <= {"push", "pull", "push_pull"}
    report = run_cli("report", run, "--json").json()
    assert report["run"]["framework"] == "mxnet" and report["run"]["ranks"] == 2
    assert report["summary"]["hidden"] == "no"
    comm_ops = {op["op"] for op in report["top_ops"] if op["phase"] == S.COMM}
    assert "push_pull" in comm_ops


def test_pushes_during_backward_are_hidden(samples: dict[str, Path]) -> None:
    """Trainer.step right after loss.backward(): MXNet pushes a layer's gradients as soon as
    they exist, so part of the push/pull runs while earlier layers' backward still computes."""
    df = steps_with_timers(samples["dist_overlap"], MX_SAMPLES / "dist_overlap")
    assert (df["comm_total_tv"] > df["comm_tv"]).all()
    assert (df["comm_hidden_fraction"] > 0.2).all(), df.select("comm_hidden_fraction")
    report = run_cli("report", samples["dist_overlap"], "--json").json()
    assert report["summary"]["hidden"] in ("partly", "yes")
    # the same job waiting for backward first hides nothing
    waited = run_cli("report", samples["dist_sync"], "--json").json()
    assert waited["summary"]["comm_hidden_fraction"] < 0.05


# --- other people's MXNet traces (../shared/traces/mxnet) ------------------------------------------


def test_every_shared_mxnet_trace_parses() -> None:
    root = shared_traces("mxnet")
    files = sorted(root.rglob("*.json.gz"))
    assert len(files) >= 2
    for path in files:
        result = run_cli("report", path, "--json")
        assert result.code == 0, result.err
        report = result.json()
        assert report["run"]["framework"] == "mxnet"
        assert report["run"]["steps"] >= 1
        breakdown = report["summary"]["breakdown_ms"]
        assert sum(breakdown.values()) == pytest.approx(report["summary"]["step_ms"], abs=0.02)


def test_shared_gpu_cnn_iteration() -> None:
    """The GPU MNIST CNN: one training iteration, no markers: one step, from its update round."""
    root = shared_traces("mxnet/mxnet_profiler_demo_mnist_cnn")
    result = run_cli("report", root, "--json")  # the folder: the nvprof database is skipped
    assert result.code == 0, result.err
    report = result.json()
    assert report["run"]["steps"] == 1
    assert any("basic_nvprof_output.nvvp" in r for r in report["remarks"])
    assert any("inferred" in r for r in report["remarks"])
    breakdown = report["summary"]["breakdown_ms"]
    for phase in (S.IO, S.H2D, S.FORWARD, S.BACKWARD, S.UPDATE):
        assert breakdown[phase] > 0, phase
    ops = {op["op"]: op["phase"] for op in report["top_ops"]}
    assert ops.get("h2d_copy") == S.H2D
    assert ops.get("convolution_backward") == S.BACKWARD


def test_copies_on_their_own_engine_threads_are_h2d_where_nothing_else_runs() -> None:
    """The copy micro-run: one broadcast_add on cpu/0 while two CopyCPU2GPU run on gpu/0's copy
    threads, then a waitall. Read straight from the JSON: once the add is done, the iteration
    waits for the copies only, so that time is h2d (not forward, not idle)."""
    path = shared_traces("mxnet/mxnet_profiler_demo_data_copy") / (
        "cpu_gpu_data_copy_profiler_output.json.gz"
    )
    records = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]

    def span(name: str) -> tuple[float, float]:
        begins = [r["ts"] for r in records if r.get("name") == name and r.get("ph") == "B"]
        ends = [r["ts"] for r in records if r.get("name") == name and r.get("ph") == "E"]
        return min(begins) / 1e3, max(ends) / 1e3

    add_start, add_end = span("broadcast_add")
    copy_start, copy_end = span("CopyCPU2GPU")
    assert copy_start < add_start < add_end < copy_end  # the add runs under the copies
    report = run_cli("report", path, "--json").json()
    breakdown = report["summary"]["breakdown_ms"]
    assert breakdown[S.H2D] == pytest.approx(copy_end - add_end, abs=1.5)
    assert breakdown[S.FORWARD] == pytest.approx(add_end - add_start, abs=1.5)
    assert report["summary"]["bottleneck"] == S.H2D


def test_ids_above_2_53_are_kept_exactly() -> None:
    path = shared_traces("mxnet/mxnet_profiler_demo_data_copy") / (
        "cpu_gpu_data_copy_profiler_output.json.gz"
    )
    parsed = MXNetParser().parse(path)
    pids = set(parsed.events.column(S.PID).to_pylist())
    tids = set(parsed.events.column(S.TID).to_pylist())
    assert 849786139768988538 in pids  # the C API domain, above 2**53
    assert 602310518397221010 in tids  # the Python thread
    # above 2**63: the same 64 bits, as int64
    assert 13084354670121613409 - (1 << 64) in tids


# --- bad input ---------------------------------------------------------------------------------


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    text = tmp_path / "notes.json"
    text.write_text("this is not JSON\n")
    only_meta = tmp_path / "meta.json"
    only_meta.write_text(
        '{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0, '
        '"args": {"name": "MXNET_C_API"}}]}'
    )
    for path in (empty, text, only_meta):
        result = run_cli("report", path)
        assert result.code == 2, (path, result.err)
        assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


def test_truncated_trace_keeps_what_was_written(tmp_path: Path) -> None:
    text = gzip.decompress((MX_SAMPLES / "local" / "rank-0.mxnet.json.gz").read_bytes())
    cut = tmp_path / "rank-0.mxnet.json"
    cut.write_bytes(text[: len(text) * 2 // 3])
    result = run_cli("report", cut, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert any("damaged" in w for w in report["warnings"])
    assert report["run"]["steps"] >= 2
    early = tmp_path / "early.json"
    early.write_bytes(text[:200])
    result = run_cli("report", early)
    assert result.code == 2 and "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1


# --- the parameter-server launcher ---------------------------------------------------------------


def test_dmlc_launcher_stops_the_job_when_a_worker_fails() -> None:
    script = (
        "import os, sys, time\n"
        "role, task = os.environ['DMLC_ROLE'], os.environ.get('DMLC_TASK_ID')\n"
        "assert os.environ['DMLC_PS_ROOT_URI'] == '127.0.0.1' == os.environ['DMLC_NODE_HOST']\n"
        "assert os.environ['DMLC_NUM_WORKER'] == '2' and os.environ['DMLC_NUM_SERVER'] == '1'\n"
        "if role == 'worker' and task == '1': sys.exit(3)\n"
        "time.sleep(0 if role == 'worker' else 60)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceview.collectors.dmlc",
            "-n",
            "2",
            "-s",
            "1",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert "worker 1 exited with code 3" in proc.stderr
