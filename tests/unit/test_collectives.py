"""Each rank's collective calls (analysis.collectives), checked against what the sample jobs are
known to do (their groundtruth.json describes the model and how gradients are exchanged), not
against traceview's own output."""

from __future__ import annotations

import json
import re
from itertools import pairwise

import polars as pl
import pytest

from tests.conftest import SAMPLES, for_unit
from traceview.model import schema as S
from traceview.runs import open_run


def _calls(sample: str) -> tuple[pl.DataFrame, dict]:
    truth = json.loads((SAMPLES / sample / "groundtruth.json").read_text())
    with open_run([SAMPLES / sample]) as run:
        calls = pl.from_arrow(run.collectives)
        assert run.collectives.schema.equals(S.COLLECTIVES_SCHEMA, check_metadata=False)
    assert isinstance(calls, pl.DataFrame)
    return calls, truth


def _mlp_parameter_bytes(model: str) -> list[int]:
    """The float32 sizes of an 'MLP 512-1024-...-10' model's weights and biases."""
    widths = [int(w) for w in re.search(r"MLP ([\d-]+)", model).group(1).split("-")]  # type: ignore[union-attr]
    sizes = []
    for n_in, n_out in pairwise(widths):
        sizes += [4 * n_in * n_out, 4 * n_out]
    params = int(re.search(r"(\d+) float32 params", model).group(1))  # type: ignore[union-attr]
    assert sum(sizes) == 4 * params, "the model string agrees with itself"
    return sizes


def test_explicit_all_reduce_is_one_call_per_parameter_tensor() -> None:
    """explicit: dist.all_reduce(p.grad) for every parameter after backward."""
    calls, truth = _calls("pytorch/explicit")
    sizes = sorted(_mlp_parameter_bytes(truth["model"]))
    gloo = calls.filter(pl.col(S.NAME) == "gloo:all_reduce")
    for (rank, step), per_step in gloo.group_by(S.RANK, S.STEP):
        assert sorted(per_step[S.BYTES].to_list()) == sizes, f"rank {rank} step {step}"
    issued = calls.filter(pl.col(S.NAME) == "c10d::allreduce_")
    counts = issued.group_by(S.RANK, S.STEP).len()["len"].unique().to_list()
    assert counts == [len(sizes)], "one c10d call per parameter tensor, every step, every rank"


def test_ddp_buckets_carry_every_gradient_once_per_step() -> None:
    calls, truth = _calls("pytorch/ddp")
    total = sum(_mlp_parameter_bytes(truth["model"]))
    per_step = (
        calls.filter(pl.col(S.NAME) == "gloo:all_reduce")
        .group_by(S.RANK, S.STEP)
        .agg(pl.col(S.BYTES).sum())
    )
    assert per_step.height == 2 * 5  # 2 ranks, 5 profiled steps
    assert per_step[S.BYTES].unique().to_list() == [total]


def test_a_calls_bytes_come_from_the_collective_inside_it() -> None:
    """NCCL: c10d::allreduce_ records no size; record_param_comms / nccl:all_reduce inside it do."""
    calls, truth = _calls("pytorch/gpu_ddp_nccl")
    params = int(re.search(r"\((\d+) params", truth["model"]).group(1))  # type: ignore[union-attr]
    issued = calls.filter(pl.col(S.NAME) == "c10d::allreduce_")
    per_step = issued.group_by(S.STEP).agg(pl.col(S.BYTES).sum())
    assert per_step[S.BYTES].unique().to_list() == [4 * params]
    # the process group, named by record_param_comms ("Process Group Name"): the default group
    assert calls[S.GROUP].unique().to_list() == ["0"]


def test_gloo_cpu_calls_have_no_group_the_trace_does_not_name() -> None:
    calls, _ = _calls("pytorch/ddp")
    assert calls[S.GROUP].null_count() == calls.height


def _every_rank_numbers_its_calls_the_same_way(sample: str) -> None:
    """The n-th call of a view on one rank is the n-th on every other: seq runs 0..n-1 per
    (rank, view), in time order, and the ranks make as many calls of each view."""
    calls, truth = _calls(sample)
    assert calls.height > 0
    for (_rank, _name, _kind), group in calls.group_by(S.RANK, S.NAME, S.COLLECTIVE):
        ordered = group.sort(S.START_NS)
        assert ordered[S.SEQ].to_list() == list(range(group.height))
    counts = calls.group_by(S.NAME, S.COLLECTIVE, S.RANK).len()
    per_view = counts.group_by(S.NAME, S.COLLECTIVE).agg(pl.col("len").n_unique())
    assert per_view["len"].max() == 1, "every rank makes as many calls of each view"
    assert set(calls[S.RANK].unique().to_list()) == set(range(truth["world_size"]))


@pytest.mark.parametrize(
    "sample",
    for_unit(
        ["pytorch/ddp", "pytorch/explicit", "tensorflow/mwms", "mxnet/dist_sync"],
        lambda s: (SAMPLES / s,),
    ),
)
def test_every_rank_numbers_its_calls_the_same_way(sample: str) -> None:
    _every_rank_numbers_its_calls_the_same_way(sample)
