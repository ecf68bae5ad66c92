"""How a job that failed failed (analysis/failure.py): which rank, which step, which call, and
why; and where every rank was when the job ended."""

from __future__ import annotations

from typing import Literal

import msgspec

from traceview.model.results.base import Phase, Result

#: hang: a rank stopped issuing collectives while the others waited in one; desync: a rank one
#: or more collectives ahead or behind the others (a desync that ends in a hang is a desync);
#: mismatch: at the same sequence number, another op or size; crash: a rank raised or was killed
FailureKind = Literal["hang", "desync", "mismatch", "crash"]
#: finished: ended normally; blocked: inside a collective; stuck: outside one, making no
#: progress; crashed: raised (not a collective's failure); killed: ended by a signal; running:
#: known only from a Flight Recorder dump taken while it ran, every call it made complete;
#: unknown: no record or dump of it (the other ranks' dumps name it)
RankState = Literal["finished", "blocked", "stuck", "crashed", "killed", "running", "unknown"]


class StackFrame(Result):
    file: str
    line: int | None
    function: str
    code: str  # the source line (may be empty)


class Failure(Result):
    """What went wrong first (the rank named is the one that diverged or stopped first, not
    the first to time out). ``step``: the job's own step number (its first step is 0);
    ``seq``: the group's sequence number of the call (1 is the group's first collective);
    ``phase``: where the rank was, as the breakdown's phases (io: data loading)."""

    kind: FailureKind
    rank: int | None
    step: int | None
    detail: str  # the sentence the report opens with
    seq: int | None = None
    op: str | None = None
    group: str | None = None
    phase: Phase | None = None
    # the rank's main thread when it stopped, innermost last (a hang or crash; empty for a
    # desync or mismatch: the record keeps no stack of the moment the sequences parted)
    stack: list[StackFrame] = []
    waiting: list[int] = []  # ranks that waited for it
    evidence: str = ""  # which evidence it followed, and where the launcher's view differs


class RankAtEnd(Result):
    """Where one rank was when the job ended (its step record)."""

    rank: int
    last_step: int | None  # the step it was in (the job's number)
    last_seq: int | None  # its last collective's sequence number (its first group's)
    state: RankState
    in_: str | None = msgspec.field(name="in", default=None)  # the call or phase it was in
    since_s: float | None = None  # in it since, seconds before it ended
    detail: str | None = None  # how the process ended (its exception or signal)


class StepSpan(Result):
    """One step of a rank's step record: the job's number, its start and end (UNIX ns)."""

    step: int
    start_ns: int
    end_ns: int


class RankTail(Result):
    """A rank's last steps from its step record, and when it last showed a sign of life (its
    end, else its last progress: UNIX ns; None: not known): the TUI draws them along time."""

    rank: int
    steps: list[StepSpan]
    end_ns: int | None
