"""Every real trace from other people's runs (../shared/traces/pytorch) reads and analyses.

They cover both Kineto generations, GPU with NCCL, ROCm, CPU-only gloo, user annotations only,
and the old autograd profiler API. Facts checked here come from the traces' provenance notes
(../shared/traces/README.md), not from traceview's own output.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from tests.conftest import analysed, run_cli, shared_pytorch_files, shared_traces
from traceview.analysis.summary import RunInputs, summarize
from traceview.model import schema as S
from traceview.runs import ingest_run
from traceview.store import rundir as R

FILES = shared_pytorch_files()


def _ingest(path: Path | list[Path], tmp_path: Path) -> Path:
    return ingest_run(path if isinstance(path, list) else [path], tmp_path / "run")


@pytest.mark.parametrize(
    "path",
    FILES
    or [
        pytest.param(
            None, marks=pytest.mark.skip(reason="../shared/traces is not beside the repository")
        )
    ],
    ids=lambda p: p.parent.name if p else "none",
)
def test_every_shared_trace_reads_into_a_consistent_run(path: Path, tmp_path: Path) -> None:
    run = _ingest(path, tmp_path)
    events = R.read_events(run)
    assert events.schema.equals(S.EVENTS_SCHEMA, check_metadata=False)
    assert events.num_rows > 0
    df = pl.from_arrow(events)
    assert isinstance(df, pl.DataFrame)
    assert df[S.DUR_NS].min() >= 0
    assert set(df[S.PHASE].cast(pl.String).unique()) <= set(S.EVENT_PHASES)
    host = df.filter(pl.col(S.KIND).cast(pl.String).is_in(list(S.HOST_TREE_KINDS)))
    assert (host[S.SELF_NS] <= host[S.DUR_NS]).all()
    ids = set(df[S.EVENT_ID].to_list())
    assert set(df[S.PARENT].drop_nulls().to_list()) <= ids, "every parent is an event of the run"

    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame) and steps.height > 0
    parts = steps.select(pl.sum_horizontal([S.phase_ns(p) for p in S.BREAKDOWN_PHASES])).to_series()
    assert (parts == steps[S.WALL_NS]).all(), "exclusive phases add up to the step"
    for phase in S.BREAKDOWN_PHASES:
        assert steps[S.phase_ns(phase)].min() >= 0
    assert steps[S.COMM_EXPOSED_NS].le(steps[S.COMM_TOTAL_NS]).all()
    assert steps[S.COMM_HIDDEN_FRACTION].is_between(0, 1).all()

    device = df.filter(pl.col(S.KIND).cast(pl.String).is_in(list(S.DEVICE_ACTIVITY_KINDS)))
    if device.filter(pl.col(S.KIND).cast(pl.String) == S.KIND_KERNEL).height:
        assert (steps[S.TIMELINE] == S.DEVICE_GPU).all()
        # A device activity inherits the phase of the runtime call that launched it: every one
        # whose launch (same correlation id) is in the trace must be linked to it. (Launches
        # from before the profiling window are missing in some traces; those stay unlinked.)
        runtime = df.filter(pl.col(S.KIND).cast(pl.String) == S.KIND_RUNTIME)[
            S.CORRELATION
        ].drop_nulls()
        launched = device.filter(pl.col(S.CORRELATION).is_in(runtime.implode()))
        assert launched[S.PARENT].null_count() == 0
        linked = device.filter(pl.col(S.PARENT).is_not_null())
        assert linked.height >= launched.height


def test_rank_and_world_size_come_from_distributed_info(tmp_path: Path) -> None:
    path = shared_traces("pytorch/hta_cpu_only_gloo")
    run = _ingest(path, tmp_path)
    manifest = R.read_manifest(run)
    assert [r.rank for r in manifest.ranks] == [34]
    assert manifest.world_size == 300
    assert "missing rank(s) 0-33, 35-299" in manifest.notes.warnings[0]
    report = summarize(
        RunInputs(manifest, {"steps": analysed(run).steps, "ops": analysed(run).ops})
    )
    # a CPU-only gloo job: all it recorded is gloo:all_reduce on the training thread
    assert report.summary.comm_total_ms > 0
    assert report.summary.bottleneck == S.COMM


def test_nccl_kernels_are_communication_with_their_collective(tmp_path: Path) -> None:
    run = _ingest(shared_traces("pytorch/hta_nccl_parser_config"), tmp_path)
    events = pl.from_arrow(R.read_events(run))
    assert isinstance(events, pl.DataFrame)
    nccl = events.filter(pl.col(S.NAME).cast(pl.String).str.starts_with("ncclKernel_"))
    assert nccl.height > 0
    assert set(nccl[S.PHASE].cast(pl.String)) == {S.COMM}
    assert set(nccl[S.COLLECTIVE].cast(pl.String)) == {"allreduce", "broadcast"}
    ops = pl.from_arrow(analysed(run).ops)
    assert isinstance(ops, pl.DataFrame)
    assert {"allreduce", "broadcast"} <= set(ops.filter(pl.col(S.DEVICE) == "gpu")[S.OP])


def test_rocm_trace_has_host_to_device_copies(tmp_path: Path) -> None:
    run = _ingest(shared_traces("pytorch/hta_amd_mi250"), tmp_path)
    events = pl.from_arrow(R.read_events(run))
    assert isinstance(events, pl.DataFrame)
    copies = events.filter(pl.col(S.KIND).cast(pl.String) == S.KIND_MEMCPY)
    assert copies.height == 2 and set(copies[S.PHASE].cast(pl.String)) == {S.H2D}
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    assert steps[S.phase_ns(S.H2D)].sum() > 0


def test_old_kineto_format_and_old_autograd_api(tmp_path: Path) -> None:
    run = _ingest(shared_traces("pytorch/kineto_resnet50_num_workers_0"), tmp_path / "a")
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    assert steps.height == 6 and steps[S.STEP].null_count() == 0
    # num_workers=0: the data loader runs on the training thread and costs a third of the step
    io_share = steps[S.phase_ns(S.IO)].sum() / steps[S.WALL_NS].sum()
    assert io_share > 0.2

    run = _ingest(
        shared_traces("pytorch/kineto_resnet50_autograd_api_num_workers_0"), tmp_path / "b"
    )
    manifest = R.read_manifest(run)
    # no ProfilerStep markers: the six data-loader __next__ calls cut it into six steps
    # (tests/integration/test_step_selection.py holds their times to the raw JSON)
    assert any("steps inferred, from one data-loader" in r for r in manifest.notes.remarks)
    assert manifest.ranks[0].meta["steps_from"] == "dataloader"
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    assert steps.height == 6 and steps[S.STEP].null_count() == 0


def test_data_loader_workers_hide_data_loading(tmp_path: Path) -> None:
    """The same ResNet-50 run with num_workers=0 and 4: workers take io off the critical path."""
    shares = {}
    for workers in (0, 4):
        run = _ingest(
            shared_traces(f"pytorch/kineto_resnet50_num_workers_{workers}"), tmp_path / str(workers)
        )
        steps = pl.from_arrow(analysed(run).steps)
        assert isinstance(steps, pl.DataFrame)
        shares[workers] = steps[S.phase_ns(S.IO)].sum() / steps[S.WALL_NS].sum()
    assert shares[4] < 0.1 * shares[0]


def test_two_ranks_of_one_job(tmp_path: Path) -> None:
    folder = shared_traces("pytorch/hta_sampled_2rank")
    run = _ingest(folder, tmp_path)
    manifest = R.read_manifest(run)
    assert [r.rank for r in manifest.ranks] == [0, 1]
    assert manifest.world_size == 128
    report = summarize(
        RunInputs(manifest, {"steps": analysed(run).steps, "ops": analysed(run).ops})
    )
    assert report.run.ranks == 2
    assert report.summary.straggler_rank in (0, 1)


def test_duplicate_ranks_are_refused(tmp_path: Path) -> None:
    source = shared_traces("pytorch/hta_sampled_2rank/sampled_rank-0.json.gz")
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(source, tmp_path / name)
    from traceview.model.errors import BadInput

    with pytest.raises(BadInput, match="two traces say they are rank 0"):
        ingest_run([tmp_path], tmp_path / "run")


def test_schema_carries_its_version(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    run = _ingest(shared_traces("pytorch/hta_amd_mi250"), tmp_path)
    meta = pq.read_schema(R.events_path(run, 0)).metadata
    assert meta[S.SCHEMA_VERSION_KEY] == S.SCHEMA_VERSION.encode()
    assert pa.types.is_dictionary(pq.read_schema(R.events_path(run, 0)).field(S.NAME).type)


def test_no_straggler_claim_where_no_collective_could_be_matched() -> None:
    """Two ranks of a 128-rank NCCL job (each trace says world size 128): their collectives
    cannot be matched without the other 126, so nobody is known to wait for anyone. The
    report names the busiest rank as such, and claims no straggler (issue 34)."""
    import gzip
    import json

    path = shared_traces("pytorch/hta_sampled_2rank")
    worlds = {
        json.loads(gzip.decompress(f.read_bytes()))["distributedInfo"]["world_size"]
        for f in path.glob("*.json.gz")
    }
    assert worlds == {128}
    data = run_cli("report", path, "--json").json()
    summary = data["summary"]
    assert summary["comm_wait_ms"] is None  # nothing matched across ranks
    assert summary["straggler_significant"] is None and summary["straggler_phase"] is None
    assert not any(r["straggler"] for r in data["ranks"])
    text = run_cli("report", path, env={"COLUMNS": "200"}).out
    line = next(line for line in text.splitlines() if line.startswith("straggler:"))
    assert "not known" in line and "wait for it" not in line, line


def test_top_operators_count_the_counted_steps_and_set_up_apart(tmp_path: Path) -> None:
    """PARAM's ResNet (one rank, 30 inferred steps, the first a warm-up in which cuDNN searches
    its convolution algorithms: seconds of aten::conv2d). Whole-trace totals over the counted
    steps made convolution several times the step; per counted step it is what the events
    inside the counted steps' windows add up to, and the warm-up's is listed apart."""
    folder = shared_traces() / "pytorch" / "param_resnet"
    run = _ingest(sorted(folder.glob("*.json*")), tmp_path)
    report = run_cli("report", run, "--json", "--top", "40").json()
    counted = [s["step"] for s in report["per_step"] if s["excluded"] is None]
    assert 0 not in counted and len(counted) >= 20  # the warm-up is left out
    steps = pl.from_arrow(analysed(run).steps)
    assert isinstance(steps, pl.DataFrame)
    events = pl.from_arrow(R.read_events(run))
    assert isinstance(events, pl.DataFrame)
    conv = events.filter(
        (pl.col(S.OP).cast(pl.String) == "convolution")
        & (pl.col(S.DEVICE).cast(pl.String) == "cpu")
    )
    parents = events.select(pl.col(S.EVENT_ID).alias(S.PARENT), pl.col(S.OP).alias("parent_op"))
    outer = conv.join(parents, on=S.PARENT, how="left").filter(
        pl.col("parent_op").cast(pl.String).fill_null("") != "convolution"
    )
    windows = steps.filter(pl.col(S.STEP).is_in(counted)).select(S.START_NS, S.END_NS)
    inside = outer.join_where(
        windows, pl.col(S.TS_NS) >= pl.col(S.START_NS), pl.col(S.TS_NS) < pl.col(S.END_NS)
    )
    truth_ms = inside[S.DUR_NS].sum() / 1e6 / len(counted)
    ours = next(o for o in report["top_ops"] if o["op"] == "convolution" and o["device"] == "cpu")
    assert ours["total_ms_per_step"] == pytest.approx(truth_ms, rel=0.01)
    assert ours["total_ms_per_step"] < report["summary"]["step_ms"]
    set_up = next(
        o for o in report["outside_ops"] if o["op"] == "convolution" and o["device"] == "cpu"
    )
    outside_ms = (outer[S.DUR_NS].sum() - inside[S.DUR_NS].sum()) / 1e6
    assert set_up["total_ms"] == pytest.approx(outside_ms, rel=0.01)
    assert set_up["total_ms"] > 5 * report["summary"]["step_ms"]  # the algorithm search


def test_host_work_that_launches_nothing_is_named_not_launch(tmp_path: Path) -> None:
    """PARAM's ResNet frees cached blocks (cudaFree, seconds of it in the warm-up) while the
    device idles: the device waits for the host, but not for a launch. Its time inside the step
    windows with no kernel or copy running (from the events: cudaFree's spans less the device's
    busy time) is host-bound time named cudaFree, none of it launch."""
    folder = shared_traces() / "pytorch" / "param_resnet"
    run = _ingest(sorted(folder.glob("*.json*")), tmp_path)
    events = pl.from_arrow(R.read_events(run))
    steps = pl.from_arrow(analysed(run).steps)
    segments = pl.from_arrow(analysed(run).segments.read())
    assert isinstance(events, pl.DataFrame) and isinstance(steps, pl.DataFrame)
    assert isinstance(segments, pl.DataFrame)
    end = pl.col(S.TS_NS) + pl.col(S.DUR_NS)
    frees = events.filter(pl.col(S.NAME).cast(pl.String) == "cudaFree").select(
        S.TS_NS, end.alias("e")
    )
    device = events.filter(pl.col(S.DEVICE).cast(pl.String) == "gpu").select(
        S.TS_NS, end.alias("e")
    )
    windows = steps.select(S.START_NS, S.END_NS).sort(S.START_NS)

    def union(frame: pl.DataFrame) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for a, b in frame.sort(S.TS_NS).iter_rows():
            if out and a <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        return out

    def overlap(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out, j = [], 0
        for a, b in xs:
            while j < len(ys) and ys[j][1] <= a:
                j += 1
            k = j
            while k < len(ys) and ys[k][0] < b:
                lo, hi = max(a, ys[k][0]), min(b, ys[k][1])
                if hi > lo:
                    out.append((lo, hi))
                k += 1
        return out

    inside = overlap(union(frees), [tuple(w) for w in windows.iter_rows()])
    busy = union(device)
    idle_ns = sum(b - a for a, b in inside) - sum(b - a for a, b in overlap(inside, busy))
    named = segments.filter(pl.col(S.OP) == "cudaFree")
    assert set(named[S.KIND].to_list()) == {S.SEGMENT_HOST_BOUND}
    got_ns = (named[S.END_NS] - named[S.START_NS]).sum()
    assert idle_ns > 1e9  # (the warm-up's: over a second)
    assert got_ns == pytest.approx(idle_ns, rel=0.01)
    launch = segments.filter(pl.col(S.KIND) == S.SEGMENT_LAUNCH).select(S.START_NS, S.END_NS)
    launch_spans = [tuple(r) for r in launch.sort(S.START_NS).iter_rows()]
    assert sum(b - a for a, b in overlap(union(frees), launch_spans)) == 0


@pytest.mark.parametrize(
    "name",
    [
        "pytorch/hta_cpu_only_gloo",  # one rank of a gloo job: its cause, idling, is no phase
        "tensorflow/tf1_timeline_mnist_mlp_gpu/timeline_03_merged_5_runs.json.gz",
    ],
)
def test_a_bottleneck_the_cause_does_not_name_has_its_own_share(name: str) -> None:
    """Where the cause is no phase (one rank idling) the bottleneck is the largest phase, and
    the share the headline gives it is that phase's share of the step, not the cause's saving
    (the gloo rank's all-reduce was said to be 15% of a step it takes 85% of)."""
    report = run_cli("report", shared_traces(name), "--json").json()
    summary = report["summary"]
    assert summary["cause"] is not None and summary["cause"]["kind"] == "idle"
    phase = summary["bottleneck"]
    assert phase != "idle"
    measured = sum(r["breakdown_ms"][phase] for r in report["ranks"]) / len(report["ranks"])
    step = sum(r["step_ms"] for r in report["ranks"]) / len(report["ranks"])
    assert summary["bottleneck_share"] == pytest.approx(measured / step, abs=0.002)
