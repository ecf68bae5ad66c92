"""Who each process of a run is (``run.architecture``, ``ranks[].role``) and what the processes
without steps of their own did (``servers``): parameter-server jobs."""

from __future__ import annotations

from typing import Literal

from traceview.model.results.base import Result

Architecture = Literal["collective", "parameter_server"]
Role = Literal["worker", "server", "scheduler", "chief"]


class ServerSummary(Result):
    """A process that serves the workers rather than running steps: a parameter server (its
    figures from its own trace), a ps-lite scheduler or a coordinator (chief)."""

    rank: int
    role: Role
    host: str | None = None
    # optimizer operators it applied (one may update several keys) and their mean time
    updates: int = 0
    update_ms: float | None = None
    # sums of the workers' pushes (synchronous mode merges them before one update)
    sums: int = 0
    # time inside its operators ÷ from its first operator's start to its last one's end
    busy_fraction: float | None = None
    span_ms: float | None = None
    # busy most of the time: the workers' pushes queue behind it
    bottleneck: bool = False
    # a coordinator's: the steps it handed to workers (remote calls of the step function)
    dispatched: int | None = None
