"""Per rank: each rank's summary, and the ranks as a distribution for runs too large to read
rank by rank."""

from __future__ import annotations

from traceview.model.results.base import BottleneckPhase, Breakdown, Result, Timeline
from traceview.model.results.gpu import HostBound, RankGpu
from traceview.model.results.memory import RankMemory
from traceview.model.results.roles import Role


class RankSummary(Result):
    rank: int
    steps: int
    step_ms: float
    breakdown_ms: Breakdown
    comm_total_ms: float
    comm_exposed_ms: float
    comm_hidden_fraction: float
    busy_ms: float  # step - exposed comm - idle: the rank's own work
    bottleneck: BottleneckPhase | None
    timeline: Timeline
    blocked_ms: float  # exposed comm + idle: waiting for the others (or the network)
    imbalance: float  # busy time against the median rank's (0.05: 5% busier)
    straggler: bool  # this rank is the straggler and it is significant
    clock_offset_us: float | None = None  # estimated from collectives (Clocks), else null
    comm_wait_ms: float | None = None  # per step, as in Summary
    comm_transfer_ms: float | None = None
    comm_wait_total_ms: float | None = None
    comm_transfer_total_ms: float | None = None
    # the others' exposed wait per step at the calls it arrived last to (summed over them)
    caused_wait_ms: float | None = None
    last_arrivals: int | None = None  # matched calls it arrived last to (where anyone waited)
    gpu: RankGpu | None = None  # device time explained (null on CPU runs)
    memory: RankMemory | None = None  # null: the rank's trace has no memory records
    host_bound_ms: HostBound | None = None  # part of breakdown_ms; null on a CPU timeline
    # where the rank ran: its host, the OS process (where its trace says), and the device of a
    # process that drove several, each a rank (TensorFlow's mirrored strategies, JAX): GPU:4
    host: str | None = None
    pid: int | None = None
    device: str | None = None
    # a parameter-server job's worker (null: every rank is a peer of the collectives)
    role: Role | None = None
    # time inside its steps ÷ from its first step's start to its last step's end
    busy_fraction: float | None = None
    # a parameter-server worker's steps per second (from the median time between its steps'
    # starts), the mean time between one of its steps and the next, and in an asynchronous job
    # the other workers' updates it did not see per step (between its pull and its push)
    steps_per_s: float | None = None
    steps_run: int | None = None  # a parameter-server worker's steps in its trace, counted or not
    gap_ms: float | None = None
    staleness: float | None = None


class Spread(Result):
    """One figure across ranks (ms per step): its percentiles and extremes."""

    p50: float
    p90: float
    max: float
    max_rank: int
    min: float
    min_rank: int


class RankSpread(Result):
    """The ranks as a distribution, for runs too large to read rank by rank."""

    ranks: int
    step_ms: Spread
    breakdown_ms: dict[str, Spread]  # by phase, as in Breakdown
    busy_ms: Spread  # the rank's own work: step - exposed comm - idle
    blocked_ms: Spread
    comm_wait_ms: Spread | None  # null where collectives were not matched across ranks
    # by own work (busy_ms; in synchronous training every rank's step lasts as long as the
    # slowest rank's), up to 5 each: the slowest first, the fastest first
    slowest_ranks: list[int]
    fastest_ranks: list[int]
