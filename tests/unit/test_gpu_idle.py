"""GPU runs explained (analysis/gpu.py) against the recorded H100 runs' synchronized timers.

sample_traces/pytorch/gpu_* (made by make_gpu_traces.py) timed every phase with
time.perf_counter(); in the synchronized runs each lap first waited in torch.cuda.synchronize(),
so a phase's timer holds its GPU work plus the time the GPU waited for the host inside it. That
is what traceview reports as the phase's device time plus its host-bound time: the two are
never merged, and their sum must come within max(10 %, 0.3 ms) of the timer in every step.

In the unsynchronized run (gpu_async) the host runs ahead of the device: the timers measure
launching only, the kernels' own time must not change (5 % of the synchronized run's), and the
host's time goes into the synchronize at the end of the step (timed as end_sync_ms).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SAMPLES, analysed
from traceview.model import schema as S
from traceview.model.results import RunReport
from traceview.runs import ingest_run, open_run
from traceview.store import rundir as R

RUNS = ("gpu_sync", "gpu_async", "gpu_ddp_nccl", "gpu_explicit_nccl")
SYNCHRONIZED = ("gpu_sync", "gpu_ddp_nccl", "gpu_explicit_nccl")
#: traceview phase -> the training script's timer
TIMERS = {
    S.H2D: "h2d_ms",
    S.FORWARD: "forward_ms",
    S.BACKWARD: "backward_ms",
    S.UPDATE: "optimizer_ms",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gpu-idle")
    return {name: ingest_run([SAMPLES / "pytorch" / name], out / name) for name in RUNS}


def truth(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(
        (SAMPLES / "pytorch" / name / "groundtruth.json").read_text()
    )
    return data


def gpu_table(run: Path, name: str) -> pl.DataFrame:
    """The gpu table (ns) joined with the script's timers of the same steps."""
    table = pl.from_arrow(R.read_table(run / "gpu.parquet", S.GPU_SCHEMA))
    assert isinstance(table, pl.DataFrame)
    timers = pl.DataFrame(truth(name)["records"]).filter(pl.col("profiled"))
    df = table.join(timers, on=S.STEP)
    assert df.height == 5
    return df


def report(run: Path) -> RunReport:
    with open_run([run]) as opened:
        return opened.report()


@pytest.mark.parametrize("name", RUNS)
def test_busy_and_the_three_kinds_of_idle_add_up_to_the_step(
    runs: dict[str, Path], name: str
) -> None:
    df = gpu_table(runs[name], name)
    bound = sum(df[S.host_bound_ns(p)] for p in S.GPU_HOST_BOUND_PHASES)
    assert (df[S.BUSY_NS] + bound + df[S.IDLE_DATA_NS] + df[S.IDLE_OTHER_NS] == df[S.WALL_NS]).all()
    device = sum(df[S.device_ns(p)] for p in S.ATTRIBUTION_PRIORITY if p != S.IDLE)
    assert (device == df[S.BUSY_NS]).all()
    assert (df[S.IDLE_OTHER_NS] >= 0).all()
    # On a GPU timeline the breakdown's h2d, forward, backward and update are the device's time
    # in that phase plus its host-bound time, the steps table holding the host-bound part on its
    # own (the gpu table's figure: one cut), and the data part of the device's idle time is the
    # breakdown's io (the host in the DataLoader while the device has nothing).
    steps = pl.from_arrow(analysed(runs[name]).steps)
    assert isinstance(steps, pl.DataFrame)
    both = df.join(steps, on=[S.RANK, S.STEP], suffix="_steps")
    for phase in S.GPU_HOST_BOUND_PHASES:
        bound = S.host_bound_ns(phase)
        assert (both[bound] == both[f"{bound}_steps"]).all()
        assert (both[S.device_ns(phase)] + both[bound] == both[S.phase_ns(phase)]).all()
    assert (both[S.IDLE_DATA_NS] == both[S.phase_ns(S.IO)]).all()
    if name == "gpu_sync":  # no communication: the breakdown's idle is the device's other idle
        assert (both[S.phase_ns(S.IDLE)] == both[S.IDLE_OTHER_NS]).all()


@pytest.mark.parametrize("name", SYNCHRONIZED)
def test_device_plus_host_bound_is_the_synchronized_timer(runs: dict[str, Path], name: str) -> None:
    df = gpu_table(runs[name], name)
    for phase, timer in TIMERS.items():
        device = df[S.device_ns(phase)] / 1e6
        host = df[S.host_bound_ns(phase)] / 1e6
        total = device + host
        allowed = (0.10 * df[timer]).clip(lower_bound=0.3)
        bad = df.with_columns(device=device, host_bound=host, total=total).filter(
            (total - df[timer]).abs() > allowed
        )
        assert bad.height == 0, (
            f"{name} {phase}:\n{bad.select(S.STEP, 'device', 'host_bound', 'total', timer)}"
        )
    # the same in the report, as means per step, the two parts apart
    gpu = report(runs[name]).ranks[0].gpu
    assert gpu is not None
    for p in gpu.phases:
        assert p.total_ms == pytest.approx(p.device_ms + p.host_bound_ms, abs=0.0015)
        if p.phase in TIMERS:
            timer = float(df[TIMERS[p.phase]].mean())  # type: ignore[arg-type]
            assert abs(p.total_ms - timer) <= max(0.10 * timer, 0.3), (p, timer)


def test_the_optimizer_is_host_bound_not_short(runs: dict[str, Path]) -> None:
    """The SGD update launches ~30 tiny kernels: 0.06 ms on the device against a ~1 ms timer.
    The device time alone is a tenth of the timer; the rest is the device waiting for the host."""
    df = gpu_table(runs["gpu_sync"], "gpu_sync")
    device = df[S.device_ns(S.UPDATE)] / 1e6
    host = df[S.host_bound_ns(S.UPDATE)] / 1e6
    assert (device < 0.1 * df["optimizer_ms"]).all()
    assert (host > 5 * device).all()


def test_unsynchronized_run_keeps_the_kernel_time_and_the_host_waits_at_the_end(
    runs: dict[str, Path],
) -> None:
    sync = gpu_table(runs["gpu_sync"], "gpu_sync")
    lagging = gpu_table(runs["gpu_async"], "gpu_async")
    for phase in TIMERS:
        column = S.device_ns(phase)
        assert lagging[column].mean() == pytest.approx(sync[column].mean(), rel=0.05), phase
    # The host launches the update while the device still works through backward's backlog:
    # the device does not wait for it (it does in the synchronized run)...
    assert lagging[S.host_bound_ns(S.UPDATE)].mean() < 0.05e6  # type: ignore[operator]
    assert sync[S.host_bound_ns(S.UPDATE)].mean() > 0.5e6  # type: ignore[operator]
    assert lagging[S.QUEUE_MEAN].mean() > sync[S.QUEUE_MEAN].mean()  # type: ignore[operator]
    # ...and the host's time ends up in the synchronize at the end of the step, timed alone.
    sync_ms = lagging[S.SYNC_NS] / 1e6
    assert (
        (sync_ms - lagging["end_sync_ms"]).abs()
        <= (0.05 * lagging["end_sync_ms"]).clip(lower_bound=0.2)
    ).all(), (
        sync_ms.to_list(),
        lagging["end_sync_ms"].to_list(),
    )


@pytest.mark.parametrize("name", RUNS)
def test_kernels_launched_per_step_are_the_kernels_in_the_trace(
    runs: dict[str, Path], name: str
) -> None:
    """make_gpu_traces.py counted the kernels of every profiled step in the trace it wrote."""
    steps = truth(name)["trace"]["steps"]  # type: ignore[index]
    expected = sum(s["kernels"] for s in steps.values()) / len(steps)
    gpu = report(runs[name]).ranks[0].gpu
    assert gpu is not None and gpu.launches == pytest.approx(expected, abs=0.05)
    launches = pl.from_arrow(R.read_table(runs[name] / "launches.parquet", S.LAUNCHES_SCHEMA))
    assert isinstance(launches, pl.DataFrame)
    total = launches.filter(pl.col(S.PHASE).is_null())
    per_op = launches.filter(pl.col(S.OP).is_not_null())
    per_phase = launches.filter(pl.col(S.PHASE).is_not_null() & pl.col(S.OP).is_null())
    assert total[S.KERNELS].sum() == per_op[S.KERNELS].sum() == per_phase[S.KERNELS].sum()
    # one row per step, each the step's own kernels, as the trace's writer counted them
    per_step = dict(zip(total[S.STEP].to_list(), total[S.KERNELS].to_list(), strict=True))
    assert per_step == {int(k): s["kernels"] for k, s in steps.items()}
    # a launch latency is never negative: no kernel starts before the call that launched it
    assert (launches[S.LATENCY_P50_NS] >= 0).all()
    assert 0 < gpu.short_kernel_fraction < 1  # type: ignore[operator]


def test_verdict_names_the_data_loader(runs: dict[str, Path]) -> None:
    """In every recorded run the DataLoader (num_workers=0) takes a third of the step while the
    device has nothing to do: the verdict says so, once."""
    for name in RUNS:
        result = report(runs[name])
        verdict = result.gpu_verdict
        assert verdict is not None and verdict.wait == "data", name
        gpu = result.ranks[0].gpu
        assert gpu is not None
        assert verdict.idle_fraction == pytest.approx(1 - gpu.busy_fraction, abs=1e-3)
        data = truth(name)["records"]  # type: ignore[index]
        timer = sum(r["data_ms"] for r in data if r["profiled"]) / 5
        # the DataLoader's timer holds its region and the Python around it
        assert verdict.wait_fraction * result.ranks[0].step_ms <= timer + 0.1


@pytest.mark.parametrize("name", RUNS)
def test_the_report_carries_each_phases_host_bound_part(runs: dict[str, Path], name: str) -> None:
    """summary, ranks[] and per_step[] hold the host-bound part of each breakdown phase: the
    steps table's figure, the same as ranks[].gpu.phases', and breakdown = device + it."""
    result = report(runs[name])
    rank = result.ranks[0]
    assert rank.host_bound_ms is not None and rank.gpu is not None
    assert result.summary.host_bound_ms == rank.host_bound_ms  # one rank: its mean
    phases = {p.phase: p for p in rank.gpu.phases}
    for phase in S.GPU_HOST_BOUND_PHASES:
        assert rank.host_bound_ms[phase] == phases[phase].host_bound_ms
        assert rank.breakdown_ms[phase] == pytest.approx(phases[phase].total_ms, abs=0.0015)
    steps = pl.from_arrow(analysed(runs[name]).steps)
    assert isinstance(steps, pl.DataFrame)
    for row in result.per_step:
        assert row.host_bound_ms is not None
        table = steps.filter(pl.col(S.STEP) == row.step)
        for phase in S.GPU_HOST_BOUND_PHASES:
            assert row.host_bound_ms[phase] == table[S.host_bound_ns(phase)].item() / 1e6


def test_cpu_runs_have_no_gpu_figures(tmp_path: Path) -> None:
    run = ingest_run([SAMPLES / "pytorch" / "explicit"], tmp_path / "run")
    result = report(run)
    assert all(r.gpu is None for r in result.ranks) and result.gpu_verdict is None
    # no host-bound part anywhere: null, not 0
    assert result.summary.host_bound_ms is None
    assert all(r.host_bound_ms is None for r in result.ranks)
    assert all(s.host_bound_ms is None for s in result.per_step)
    assert R.read_table(run / "gpu.parquet", S.GPU_SCHEMA).num_rows == 0


def _host_bound_holds(run: Path) -> int:
    """The steps table and the gpu table hold one host-bound figure (one cut of the timeline);
    every phase of the breakdown on a GPU timeline is its device time plus that figure; the
    exclusive phases add up to the step; CPU timelines have no host-bound part (null). Returns
    how many GPU step windows were checked."""
    steps = pl.from_arrow(analysed(run).steps)
    gpu = pl.from_arrow(R.read_table(run / "gpu.parquet", S.GPU_SCHEMA))
    assert isinstance(steps, pl.DataFrame) and isinstance(gpu, pl.DataFrame)
    phases = sum(steps[S.phase_ns(p)] for p in S.BREAKDOWN_PHASES)
    assert (phases == steps[S.WALL_NS]).all()
    bound = [S.host_bound_ns(p) for p in S.GPU_HOST_BOUND_PHASES]
    cpu = steps.filter(pl.col(S.TIMELINE) == S.DEVICE_CPU)
    assert all(cpu[c].null_count() == cpu.height for c in bound)
    on_gpu = steps.filter(pl.col(S.TIMELINE) == S.DEVICE_GPU)
    both = on_gpu.join(gpu, on=[S.RANK, S.STEP], how="inner", suffix="_gpu", nulls_equal=True)
    assert both.height == on_gpu.height == gpu.height
    for phase in S.GPU_HOST_BOUND_PHASES:
        column = S.host_bound_ns(phase)
        assert (both[column] == both[f"{column}_gpu"]).all(), phase
        assert (both[S.device_ns(phase)] + both[column] == both[S.phase_ns(phase)]).all(), phase
    return both.height


@pytest.mark.parametrize("name", RUNS)
def test_one_host_bound_figure_on_the_samples(runs: dict[str, Path], name: str) -> None:
    assert _host_bound_holds(runs[name]) == 5
