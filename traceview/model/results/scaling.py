"""``traceview scaling --json``: runs of one job at several rank counts, the scaling models and
their predictions."""

from __future__ import annotations

from typing import Literal

from traceview.model.results.base import RESULTS_VERSION, Breakdown, Result


class ScalingBase(Result):
    label: str
    ranks: int
    step_ms: float
    breakdown_ms: Breakdown


class Prediction(Result):
    step_ms: float
    speedup: float | None
    error: float | None  # |predicted - measured| / measured


class OwnPrediction(Result):
    step_ms: float
    error: float | None


class AllReduceRate(Result):
    bytes_per_step: int
    algbw_gbps: float
    busbw_gbps: float
    efficiency: float
    bus_efficiency: float


class ScaledRun(Result):
    label: str
    ranks: int
    step_ms: float
    speedup: float | None
    efficiency: float | None
    batch_size: int | None
    batch_size_from: Literal["user", "input shapes"] | None
    samples_per_s: float | None
    compute_ratio: float | None  # compute per step against the smallest run's
    comm_total_ms: float
    comm_exposed_ms: float
    comm_hidden_fraction: float
    breakdown_ms: Breakdown
    predicted: dict[str, Prediction]  # model -> prediction from the smallest run
    predicted_own_compute: dict[str, OwnPrediction]  # model -> on this run's own breakdown
    what_if: dict[str, float | None]  # <what>_ms and <what>_speedup
    allreduce: AllReduceRate | None  # with --link-gbps, where message sizes are known
    # t_comm(N) the models used: the transfer (all of it, hidden included) where collectives
    # were matched across ranks, else comm_total_ms
    comm_model_ms: float | None = None
    comm_wait_ms: float | None = None  # exposed wait for the last rank: imbalance, not modelled


class ModelFit(Result):
    mean_error: float | None


class CollectiveFit(Result):
    """A collective's transfer as latency + bytes / bandwidth, fitted on the runs' own matched
    calls (time = latency_ms x (ranks - 1) + bus bytes / bandwidth; bus bytes as nccl-tests
    count them: 2(n - 1)/n of the message for an all-reduce)."""

    op: str  # (untrusted)
    latency_ms: float  # per step of the algorithm (one per other rank)
    busbw_gbps: float | None  # Gb/s (bits); null: sizes unknown or no growth with size
    calls: int  # the matched calls (positions x runs) it was fitted on
    runs: list[int]  # the rank counts of the runs it was fitted on


class Extrapolation(Result):
    """A data-parallel step at a rank count never run, from the largest run and the fitted
    collectives: its step with the communication the model predicts there, at the largest run's
    share of communication exposed."""

    ranks: int
    comm_ms: float  # predicted transfer per step (each call's, summed)
    step_ms: float
    speedup: float | None  # against the smallest run (weak scaling)


class ExtrapolationCheck(Result):
    """The model fitted without the largest run, predicting it: how far off it is."""

    fitted_on: list[int]  # rank counts
    ranks: int
    predicted_comm_ms: float
    measured_comm_ms: float  # the largest run's calls' transfers per step, each call counted
    comm_error: float
    predicted_step_ms: float
    measured_step_ms: float
    step_error: float


class Scaling(Result):
    """``traceview scaling --json``."""

    base: ScalingBase
    runs: list[ScaledRun]
    models: dict[str, ModelFit]
    best_model: str | None
    batch_size: int | None
    link_gbps: float | None
    notes: list[str]
    schema_version: str = RESULTS_VERSION
    # ranks never run: a latency-bandwidth model per collective, the steps at 2x and 4x the
    # largest run's ranks, and the model checked on the largest run (fitted without it)
    collective_model: list[CollectiveFit] = []
    extrapolated: list[Extrapolation] = []
    extrapolation_check: ExtrapolationCheck | None = None
