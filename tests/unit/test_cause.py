"""The cause's rules (analysis/critical_path/cause.py) on hand-made blame and replays: what stands
out, who holds it, what a path that is not explained allows. The live jobs with injected causes
are in tests/live/test_critical_path.py."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.cause import (
    Candidate,
    candidates,
    cause_words,
    noise_ms,
    pick,
)
from traceview.analysis.critical_path.late import before
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.results import Blame, Cause, WhatIf


def _whatifs(base: float, **replayed: float) -> list[WhatIf]:
    out = [WhatIf(change="none", step_ms=base, speedup=1.0)]
    for change, ms in replayed.items():
        out.append(WhatIf(change=change.replace("__", ":"), step_ms=ms, speedup=base / ms))
    return out


STEPS = [100.0, 101.0, 99.0, 100.5, 99.5]  # (a spread of about 1 ms)


def test_the_cause_is_what_saves_the_most_beyond_its_floor() -> None:
    slow = Candidate("compute", 2, "backward", None, 30.0, "balance:rank=2")
    comm = Candidate("transfer", None, "comm", "allreduce", 12.0, "without:comm")
    whatif = _whatifs(100.0, **{"balance": 72.0, "balance__rank=2": 72.0, "without__comm": 91.0})
    picked = pick([slow, comm], whatif, STEPS, ranks=3)
    assert picked.cause is not None and picked.cause.change == "balance:rank=2"
    assert picked.cause.ms == 28.0 and picked.cause.speedup == round(100 / 72, 3)
    assert picked.straggler is not None and picked.straggler.rank == 2
    # a cost of the whole run needs 10% of the step: 9 ms is not enough, alone or not
    assert pick([comm], whatif, STEPS, ranks=3).cause is None


def test_a_rank_that_holds_little_of_what_balancing_saves_is_no_straggler() -> None:
    """Balancing rank 1 alone saves 6 of the 18 ms balancing every rank saves: the ranks take
    turns being slow (a third each), nobody holds it."""
    turn = Candidate("compute", 1, "forward", None, 20.0, "balance:rank=1")
    whatif = _whatifs(100.0, **{"balance": 82.0, "balance__rank=1": 94.0})
    assert pick([turn], whatif, STEPS, ranks=3) == pick([], whatif, STEPS, ranks=3)
    assert pick([turn], whatif, STEPS, ranks=3).straggler is None


def test_a_rank_the_others_wait_for_alone_is_named_where_its_replay_saves_little() -> None:
    """Two devices sharing a host's cores (the JAX run of tests/live/test_devices.py, its figures
    rounded): the other waits 23 ms a step for rank 1, whose forward holds 63 ms of the path;
    replayed at the median, rank 1 saves only 4.8 ms (the replay keeps the other's waiting for a
    core), under 5% of the step and the steps' spread: the wait, its alone, names it. Where the
    waiting is shared (ranks 0, 2 and 3 waited for by turns, the scaling sample's figures), the
    same small saving names no one."""
    noisy = [116.1, 104.6, 79.8, 101.7, 115.2, 97.2]
    slow = Candidate("kernel", 1, "forward", None, 63.3, "balance:rank=1")
    whatif = _whatifs(102.4, **{"balance": 84.8, "balance__rank=1": 97.6})
    picked = pick([slow], whatif, noisy, ranks=2, waited_for={1: 23.4})
    assert picked.straggler is not None and picked.straggler.rank == 1
    assert picked.straggler.phase == "forward" and picked.straggler.ms == 4.8
    # without the measured wait, the replay alone is under its floor
    assert pick([slow], whatif, noisy, ranks=2).straggler is None
    turns = {0: 6.9, 1: 9.8, 3: 2.6}
    shared = Candidate("compute", 1, "backward", None, 7.0, "balance:rank=1")
    whatif = _whatifs(94.4, **{"balance": 84.7, "balance__rank=1": 93.0})
    assert pick([shared], whatif, STEPS, ranks=4, waited_for=turns).straggler is None


def test_nothing_stands_out_within_the_steps_own_spread() -> None:
    noisy = [60.0, 140.0, 100.0, 70.0, 130.0]
    assert noise_ms(noisy) > 20
    late = Candidate("late_start", 1, None, None, 15.0, "no_late_start:rank=1")
    whatif = _whatifs(100.0, **{"no_late_start__rank=1": 88.0})
    assert pick([late], whatif, STEPS, ranks=2).cause is not None  # 12 ms over a 1 ms spread
    assert pick([late], whatif, noisy, ranks=2).cause is None  # within a 30 ms spread


def test_one_ranks_data_loading_is_named_over_every_ranks() -> None:
    everyone = Candidate("io", 1, "io", None, 16.0, "without:io")
    rank = Candidate("io", 1, "io", None, 16.0, "balance:rank=1")
    whatif = _whatifs(100.0, **{"balance": 85.0, "without__io": 84.0, "balance__rank=1": 85.0})
    cause = pick([everyone, rank], whatif, STEPS, ranks=2).cause
    assert cause is not None and cause.change == "balance:rank=1"


def test_an_unexplained_path_names_only_what_a_ranks_own_timeline_tells() -> None:
    late = Candidate("late_start", 1, None, None, 30.0, "no_late_start:rank=1")
    host = Candidate("host_bound", 0, "forward", None, 12.0, "without:host_bound")
    whatif = _whatifs(100.0, **{"no_late_start__rank=1": 70.0, "without__host_bound": 88.0})
    assert pick([late, host], whatif, STEPS, ranks=2).cause.kind == "late_start"  # type: ignore[union-attr]
    cause = pick([late, host], whatif, STEPS, ranks=2, explained=False).cause
    assert cause is not None and cause.kind == "host_bound"


def _rows(*rows: tuple[int, int, str | None, str, str | None, int]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["step", "rank", "phase", "kind", "op", "ns"], orient="row")


def test_a_late_start_held_step_after_step_is_its_ranks_and_in_turn_everyones() -> None:
    ms = 10_000_000  # 10 ms
    held = _rows(*[(s, 1, None, "late_start", None, 2 * ms) for s in range(4)])
    blame = [Blame(rank=1, phase=None, kind="late_start", ms=20.0, share=0.2)]
    (c,) = candidates(held, 4, blame, ranks=2)
    assert (c.rank, c.change, c.blamed_ms) == (1, "no_late_start:rank=1", 20.0)
    # within twice the clocks' residual (ranks on several hosts), a late start is none
    assert candidates(held, 4, blame, ranks=2, clock_ms=11.0) == []
    # ranks 0 and 1 late in turn, each in half of the steps: nobody holds it
    turns = _rows(*[(s, s % 2, None, "late_start", None, 2 * ms) for s in range(4)])
    blame = [Blame(rank=r, phase=None, kind="late_start", ms=10.0, share=0.1) for r in (0, 1)]
    (c,) = candidates(turns, 4, blame, ranks=2)
    assert (c.rank, c.change, c.blamed_ms) == (None, "no_late_start", 20.0)


def test_where_another_chain_takes_over_the_words_name_who_then_ends_the_step() -> None:
    """Rank 3 starts 30 ms late on the path, but without its late start the step is only 8 ms
    shorter: rank 5 then ends the replayed steps last. Where a cause saves most of its blame
    no rank is named."""
    late = Candidate("late_start", 3, None, None, 30.0, "no_late_start:rank=3")
    whatif = _whatifs(100.0, **{"no_late_start__rank=3": 92.0})
    whatif[1].last_rank = 5
    cause = pick([late], whatif, STEPS, ranks=6).cause
    assert cause is not None and cause.then_rank == 5
    assert cause.text.endswith("rank 5 then ends the step last (the others wait for it)")
    whatif[1].step_ms = 75.0  # (saves 25 of its 30 ms)
    cause = pick([late], whatif, STEPS, ranks=6).cause
    assert cause is not None and cause.then_rank is None and "ends the step" not in cause.text


def test_host_work_that_is_no_launch_gets_its_own_advice() -> None:
    """The device waiting while the host is in the allocator (cudaMalloc, hipFree) or in another
    runtime call is no launch problem: fewer, larger kernels would not help."""
    from traceview.model.results import Cause
    from traceview.views.advice import cause_advice

    def advice(kind: str, op: str | None) -> str:
        cause = Cause(kind=kind, rank=None, phase="forward", op=op, ms=10.0, blamed_ms=12.0,
                      change=f"without:{kind}", step_ms=90.0, speedup=1.11, text="")  # fmt: skip
        return cause_advice(cause, "pytorch") or ""

    for allocator in ("cudaMalloc", "cudaFree", "hipMalloc", "cudaHostAlloc"):
        assert "allocator" in advice("host_bound", allocator), allocator
    assert "cudaStreamCreateWithFlags" in advice("host_bound", "cudaStreamCreateWithFlags")
    for launch_bound in (advice("launch", "convolution"), advice("host_bound", "convolution")):
        assert "fewer, larger kernels" in launch_bound


def test_where_a_late_rank_was_is_its_previous_steps_end_and_the_time_between_steps() -> None:
    """Rank 1 starts step 2 20 ms after rank 0: from 100 to 120 ms it idled (100-110), ran its
    update (110-115, one operator), then nothing of its steps (115-120: between its steps)."""
    ms = 1_000_000
    segments = pa.table(
        {
            "rank": pa.array([0, 0, 1, 1, 1, 1], pa.int32()),
            "step": pa.array([1, 2, 1, 1, 1, 2], pa.int64()),
            "start_ns": [0, 100 * ms, 0, 60 * ms, 110 * ms, 120 * ms],
            "end_ns": [100 * ms, 150 * ms, 60 * ms, 110 * ms, 115 * ms, 150 * ms],
            "phase": ["forward", "forward", "forward", "idle", "update", "forward"],
            "kind": ["compute", "compute", "compute", "idle", "compute", "compute"],
            "op": [None, None, None, None, "aten::add_", None],
        }
    )
    windows = pl.DataFrame(
        {
            "rank": [0, 0, 1, 1],
            "step": [1, 2, 1, 2],
            "s": [0, 100, 0, 120],
            "e": [100, 150, 115, 150],
        }
    ).with_columns(pl.col("s", "e") * ms)
    spent = before(TableOnDemand.of(segments), windows, 1, [2])
    got = [(s.kind, s.phase, s.op, s.ms) for s in spent]
    assert got == [
        ("idle", "idle", None, 10.0),
        ("compute", "update", "aten::add_", 5.0),
        ("between_steps", None, None, 5.0),
    ]
    # on time in step 2: nothing to say
    assert before(TableOnDemand.of(segments), windows, 0, [2]) == []
    cause = Cause(
        kind="late_start", rank=1, phase=None, op=None, ms=20.0, blamed_ms=20.0,
        change="no_late_start:rank=1", step_ms=130.0, speedup=1.15, text="", before=spent,
    )  # fmt: skip
    words = cause_words(cause, 150.0)
    assert (
        "meanwhile it was ending its previous step: idle outside every operator 10 ms, update "
        "5 ms (most in aten::add_); between its steps (outside every step marker) 5 ms" in words
    ), words


def test_the_rank_that_takes_over_is_named_with_its_phase() -> None:
    """Removing rank 3's late start saves 1 ms of its 10 on the path: rank 5 then ends the step,
    and the words say what the others then wait for."""
    cause = Cause(
        kind="late_start", rank=3, phase=None, op=None, ms=1.0, blamed_ms=10.0,
        change="no_late_start:rank=3", step_ms=99.0, speedup=1.01, text="", then_rank=5,
        then_phase="backward",
    )  # fmt: skip
    assert "; rank 5 then ends the step last (the others wait for its backward)" in cause_words(
        cause, 100.0
    )
    cause.then_phase = None
    assert "; rank 5 then ends the step last (the others wait for it)" in cause_words(cause, 100.0)


def test_compare_names_a_dispatch_cause_and_a_server_as_what_they_are() -> None:
    from traceview.analysis.critical_path.cause import cause_brief

    dispatch = Cause(
        kind="dispatch", rank=3, phase="idle", op=None, ms=27.1, blamed_ms=27.1,
        change="dispatch", step_ms=69.3, speedup=1.89, text="",
    )  # fmt: skip
    assert cause_brief(dispatch) == (
        "the workers idling between the steps their coordinator hands them cost 27.1 ms per "
        "step (1.89x without)"
    )
    server = Cause(
        kind="server", rank=2, phase="comm", op="update", ms=8.0, blamed_ms=8.0,
        change="server:rank=2", step_ms=20.0, speedup=1.4, text="",
    )  # fmt: skip
    assert cause_brief(server).startswith("the workers' pushes queueing at server rank 2 cost 8")


def test_advice_is_said_in_the_runs_frameworks_words() -> None:
    """The remedy names the run's framework's API: a TensorFlow job is told about tf.data and
    CommunicationOptions, never DataLoader or DDP's buckets; a run of no known framework (or of
    several) gets the remedy without any framework's API."""
    from traceview.model.results import Cause
    from traceview.views.advice import cause_advice, gpu_advice

    def advice(kind: str, phase: str, framework: str | None) -> str:
        cause = Cause(kind=kind, rank=None, phase=phase, op=None, ms=10.0, blamed_ms=12.0,
                      change=f"without:{phase}", step_ms=90.0, speedup=1.11, text="")  # fmt: skip
        return cause_advice(cause, framework) or ""

    pytorch_words = ("DataLoader", "DDP", "bucket_cap_mb", "torch", "CUDA graphs", "non_blocking")
    named = {
        "pytorch": ("DataLoader", "bucket_cap_mb", "torch.compile"),
        "tensorflow": ("tf.data", "CommunicationOptions", "jit_compile"),
        "mxnet": ("preprocess_threads", "set_gradient_compression", "hybridize"),
        "chainer": ("MultiprocessIterator", "double_buffering", "static_graph"),
        "jax": ("device_put", "jit", "jit"),
    }
    for framework, (loader, overlap, fuse) in named.items():
        io, comm = advice("io", S.IO, framework), advice("transfer", S.COMM, framework)
        launch = advice("launch", S.FORWARD, framework)
        assert loader in io and overlap in comm and fuse in launch, framework
        assert loader in (gpu_advice("data", framework) or ""), framework
        if framework != "pytorch":
            for said in (io, comm, launch, gpu_advice(S.H2D, framework) or ""):
                assert not any(w in said for w in pytorch_words), (framework, said)
    for unknown in (None, "chrome", "pytorch+tensorflow"):
        for said in (advice("io", S.IO, unknown), advice("transfer", S.COMM, unknown)):
            assert said and not any(w in said for ws in named.values() for w in ws if w != "jit"), (
                unknown,
                said,
            )
