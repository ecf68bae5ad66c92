"""The device's time explained (GPU runs): the host-bound part of the phases, device idle,
kernel launches, each rank's GPU figures and the run's GPU verdict."""

from __future__ import annotations

from typing import Literal

from traceview.model.results.base import Phase, Result


class HostBound(Result):
    """The host-bound part of each phase of a breakdown (ms; GPU timelines): the device idle
    while the host is inside that phase, launching its work. Already counted in the phase's
    figure of ``breakdown_ms`` (phase = its kernels' time + this), reported apart so the two
    never merge silently."""

    h2d: float
    forward: float
    backward: float
    update: float

    def __getitem__(self, phase: str) -> float:
        if phase not in self.__struct_fields__:
            raise KeyError(phase)
        return float(getattr(self, phase))


# (its fields are schema.GPU_HOST_BOUND_PHASES, in order: tests/unit/test_results.py holds them
# equal; this module imports no schema, nor pyarrow)


class GpuIdle(Result):
    """The device's idle time in a step (ms), by what the host did meanwhile."""

    host_bound: float  # inside an op of h2d, forward, backward or update: launching its work
    data: float  # in data loading
    other: float  # anything else (Python between phases, a synchronize outside any phase)


class GpuPhase(Result):
    """One phase on the device (ms per step): its kernels' time and the device's wait for the
    host inside it, never merged; ``total_ms`` is their sum (what a synchronized timer sees)."""

    phase: Phase
    device_ms: float  # kernels and copies (exclusive, cut among device events alone)
    # device idle while the host is inside this phase; with device_ms, the breakdown's phase
    host_bound_ms: float
    total_ms: float


class KernelLaunches(Result):
    """Kernels launched by the host (a runtime call per kernel), by phase and canonical op."""

    phase: Phase | None  # null with op: all of the rank's kernels
    op: str | None  # canonical operator of the launching call (untrusted)
    kernels_per_step: float
    # a kernel's launch delay (runtime call start to kernel start) is queueing (its stream
    # busy with earlier work) + launch latency (its stream idle): only the second is a launch
    # problem
    launch_latency_us_p50: float
    launch_latency_us_p95: float
    kernel_us_p50: float  # kernel duration
    kernel_us_p95: float
    launch_overhead_us_p50: float  # the launch call's own duration
    short_kernel_fraction: float  # kernels shorter than their launch call
    launch_queue_us_p50: float | None = None  # queueing (null: a stored analysis without it)
    launch_queue_us_p95: float | None = None
    queued_fraction: float | None = None  # the kernels' queueing / their launch delays, summed


class RankGpu(Result):
    """A GPU rank's device time explained (analysis/gpu.py), means per step."""

    busy_fraction: float  # device busy (any kernel, copy or memset) / step
    busy_ms: float
    idle_ms: GpuIdle  # busy_ms + host_bound + data + other = step_ms
    sync_ms: float  # host blocked in a device/stream synchronize, a blocking copy, .item()
    launches: float  # kernels launched per step
    # over all kernels (null: none linked to a launch): the stream idle part of the launch
    # delay, the queueing part (stream busy with earlier work) and its share of the delays
    launch_latency_us_p50: float | None
    launch_latency_us_p95: float | None
    short_kernel_fraction: float | None  # kernels shorter than the launch call that made them
    kernel_us_p50: float | None = None
    kernel_us_p95: float | None = None
    launch_queue_us_p50: float | None = None
    launch_queue_us_p95: float | None = None
    launch_queued_fraction: float | None = None
    queue_depth_max: int = 0  # operations launched, not yet started on the device: the most
    queue_depth_mean: float = 0.0  # time-weighted over the steps
    phases: list[GpuPhase] = []
    kernels: list[KernelLaunches] = []  # by phase and op, most launched first (up to 20)


#: host-bound: the device waits for the host launching work; data: for the data loader
GpuWait = Literal["host-bound", "data"]


class GpuVerdict(Result):
    """Said once (GPU runs): the device is idle a large share of the step while the host works."""

    rank: int  # the rank with the most idle device time
    wait: GpuWait
    idle_fraction: float  # device idle / step
    wait_fraction: float  # the idle time of this kind / step
    phase: Phase | None = None  # host-bound: the phase with the most host-bound time
    kernels_per_step: float | None = None  # host-bound: that phase's kernels launched per step
    kernel_us_p50: float | None = None  # and their median duration
