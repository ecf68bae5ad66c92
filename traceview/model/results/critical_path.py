"""Why the step takes as long as it does: the critical path, its blame, and what-if replays."""

from __future__ import annotations

from typing import Literal, NamedTuple

from traceview.model.results.base import Phase, Result

#: What a critical path segment is (analysis/critical_path/): a rank's own work (CPU compute,
#: a device kernel, the device waiting for the host's launches: host_bound), communication the
#: path cannot lay on another rank (transfer), a rank that began the step after the first one
#: (late_start: carried in from before the window), or nothing running (idle).
PathKind = Literal["compute", "kernel", "launch", "transfer", "late_start", "host_bound", "idle"]


class PathSegment(Result):
    """One stretch of a step's critical path: on ``rank``, from ``start_ms`` after the job's step
    began (the first rank's start), for ``ms``."""

    rank: int
    phase: Phase | None  # null for a late start
    op: str | None  # the operator (or collective) holding the time, where one does (untrusted)
    kind: PathKind
    start_ms: float
    ms: float


class Blame(Result):
    """Time on the critical path of one rank in one phase and kind (ms per step)."""

    rank: int
    phase: Phase | None
    kind: PathKind
    ms: float
    share: float  # of the job's step
    # over what the median rank spends in that phase per step (the cause, where one rank is
    # slower); null for transfer and idle
    excess_ms: float | None = None


class OpBlame(Result):
    """Time on the critical path of one operator (or collective), all ranks (ms per step)."""

    op: str  # (untrusted)
    phase: Phase | None
    kind: PathKind
    ms: float


class PathStretch(NamedTuple):
    """A stretch of a step's critical path on the run's clock (what a timeline draws)."""

    rank: int
    phase: str | None
    op: str | None
    kind: str
    start_ns: int
    dur_ns: int


class StepPath(Result):
    """One step's critical path in brief: the job's step and who holds it."""

    step_ms: float  # first rank's start to last rank's end
    complete: bool  # every wait on the path explained (else ``reason``)
    reason: str | None
    blame: list[Blame]


class CriticalPath(Result):
    """Why the step takes as long as it does (analysis/critical_path/): the critical path of
    the median counted step across ranks, and blame over every counted step."""

    step_ms: float  # the median step's job step: first rank's start to last rank's end
    step: int | None  # which step that is
    steps: int  # counted steps with a path
    complete_steps: int  # of them, every wait explained
    segments: list[PathSegment]  # the median step's path, in time order
    blame: list[Blame]  # mean per counted step, largest first
    by_op: list[OpBlame]  # the operators on the path, largest first (up to 10)
    # how far the counted steps' mean could be off by their own spread (cause.noise_ms): a
    # replay that saves less names no cause, however large a share of the step it is
    noise_ms: float = 0.0

    @property
    def explained(self) -> bool:
        """Whether most counted steps' paths are complete (else only what a rank's own
        timeline tells names a cause: ``cause.pick``)."""
        return 2 * self.complete_steps >= self.steps


#: What a cause is (``Cause.kind``): a rank's own work (``compute`` in a phase, a device
#: ``kernel``, ``launch``: the device waiting for kernel launches, ``host_bound``: for other host
#: work), data loading (``io``), communication the path cannot lay on a rank (``transfer``), a
#: rank beginning the step after the first one (``late_start``), a rank doing nothing inside the
#: step (``idle``), a pipeline's ``bubble``.
CauseKind = Literal[
    "compute", "kernel", "launch", "host_bound", "io", "transfer", "wait", "late_start", "idle",
    "bubble", "server", "dispatch",
]  # fmt: skip


class Spent(Result):
    """Where a late rank was while the others had begun the step (``Cause.before``): ms per step
    in one (phase, kind) of its previous step, or between its steps (kind ``between_steps``:
    outside every step marker; phase null)."""

    phase: Phase | None
    kind: str  # a segment kind (compute, kernel, idle, comm, ...) or between_steps
    op: str | None  # the operator holding most of it, where one does (untrusted)
    ms: float


class Cause(Result):
    """What the step loses most to (analysis/critical_path/cause.py): of what the critical path
    blames, the cause whose removal the replay says saves the most, where that is more than
    the run's step-to-step noise. Who (``rank``: the rank that sets the step where several
    share the cause, null for a cause of the whole run; ``stage``: its pipeline stage; ``group``:
    the process group of a collective), what (``kind``, ``phase``, ``op``), what it costs (``ms``
    per step: the replayed step without it, ``step_ms``, against the replay with no change),
    the blamed time that is the evidence, the ``change`` that removes it (as ``whatif`` names
    it) and ``text``: all of it in words."""

    kind: CauseKind
    rank: int | None
    phase: Phase | None
    op: str | None  # (untrusted)
    ms: float  # what it costs per step (the replay without it saves this)
    blamed_ms: float  # its time on the critical path per step
    change: str  # the whatif change that removes it
    step_ms: float  # the replayed step without it
    speedup: float
    text: str  # (names from the trace in it are untrusted)
    stage: int | None = None
    group: str | None = None  # (untrusted)
    others: list[int] = []  # other ranks that share the cause (late starts: those also late)
    # where removing it saves less than half its blamed time (another chain takes over): the
    # rank that then ends the step, most often (null: it saves most of its blame)
    then_rank: int | None = None
    then_phase: Phase | None = None  # that rank's phase with the most own time on the path
    # a late start's: its rank's idling on the path (in ``blamed_ms``): the change removes the
    # idling that ends its steps after its last wait with the late start it makes
    idle_ms: float | None = None
    # a late start's: where its rank was while the others had begun the step, largest first
    before: list[Spent] = []


class WhatIf(Result):
    """A replay of the counted steps with one change (analysis/critical_path/whatif.py): ``none``,
    ``balance``, ``balance:rank=N``, ``faster:NAME:K``, ``bandwidth:OP:GBPS``, ``hide_comm``,
    ``no_late_start``."""

    change: str
    step_ms: float  # mean replayed job step
    speedup: float  # the replay with no change over this one
    # the rank that ends the replayed steps last, most often (null: the steps' own last rank
    # is not kept, a run without ranks)
    last_rank: int | None = None


class WhatIfs(Result):
    """``traceview whatif --json``: the replays asked for (the first: no change)."""

    steps: int  # counted steps replayed
    whatif: list[WhatIf]
    not_applicable: list[str] = []  # changes asked for that nothing in the run matches
