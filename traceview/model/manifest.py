"""The run directory's records, typed: a rank's status (raw/rank-N/status.json, written by the
collector inside the job), the "collect" section (written by the launcher) and the manifest
(written by ingest). Every field has a default, so a partial manifest (collect's, before
ingest) or one written by another traceview version reads, and unknown keys are ignored. In
the manifest, which traceview wrote, a value of the wrong type is bad input (``from_json``);
in what the job wrote (status files, the collect section) only that field is dropped
(``lenient``).

The collectors inside the user's job write status.json with the standard library only (their
``Status`` dataclass); ``RankStatus`` is the reading side of the same record.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from traceview.model.errors import BadInput

R = TypeVar("R", bound="Record")

#: The largest world size believed (2**18: the largest jobs run on about 10**5 GPUs). A file
#: claiming more is corrupt or hostile: a run's memory follows its world size (missing ranks).
MAX_WORLD_SIZE = 1 << 18
#: The largest clock offset believed: 100 years (a host whose clock reads 1970 is still within
#: it); adding a larger one to a time could overflow int64 nanoseconds.
MAX_CLOCK_OFFSET_NS = 100 * 365 * 86_400 * 10**9

#: The largest status.json read (a rank's is a few KiB; its memory samples, a few per step).
MAX_STATUS_BYTES = 16 << 20
#: The largest pid a Linux host gives (``pid_max`` cannot exceed 2**22).
MAX_PID = 1 << 22

#: Roles of a parameter-server job whose processes run no training steps of their own.
SERVICE_ROLES = ("server", "scheduler", "chief")
#: A process's role as a job names it (ps-lite's DMLC_ROLE, TF_CONFIG's task type) -> traceview's;
#: any other name is not believed (it comes from the job: untrusted).
ROLE_NAMES = {
    "worker": "worker", "server": "server", "ps": "server", "scheduler": "scheduler",
    "chief": "chief", "master": "chief",
}  # fmt: skip


def role_named(value: object) -> str | None:
    """traceview's name of a role as a job or a trace names it (None: not a role it knows)."""
    return ROLE_NAMES.get(value.strip().lower()) if isinstance(value, str) else None


Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]
Pid = Annotated[int, msgspec.Meta(ge=1, le=MAX_PID)]
Ticks = Annotated[int, msgspec.Meta(ge=0)]
WorldSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_WORLD_SIZE)]
ClockOffset = Annotated[int, msgspec.Meta(ge=-MAX_CLOCK_OFFSET_NS, le=MAX_CLOCK_OFFSET_NS)]


class Record(msgspec.Struct, kw_only=True):
    def to_builtins(self) -> Any:
        return msgspec.to_builtins(self)


def from_json(data: bytes | str, kind: type[Any], what: str) -> Any:
    """``data`` read as ``kind``; ``what`` names the file in the error of a malformed one."""
    try:
        return msgspec.json.decode(data, type=kind)
    except (
        msgspec.ValidationError,
        msgspec.DecodeError,
        RecursionError,
        UnicodeDecodeError,
    ) as exc:
        raise BadInput(f"{what}: unreadable ({exc})") from None


class Clock(Record):
    """How a rank's clock maps onto the launcher's, which all ranks share."""

    offset_ns: ClockOffset = 0  # add to the rank's time to get the launcher's
    uncertainty_ns: int | None = None  # half the best round trip
    method: str = "wallclock"  # tcp (probed against the launcher) or wallclock (assumed 0)
    probes: int = 0


class RankStatus(Record):
    """raw/rank-NNNNN/status.json: the rank's own account of its run."""

    rank: Rank | None = None
    world_size: WorldSize | None = None
    local_rank: int | None = None
    rank_source: str | None = None
    host: str | None = None
    pid: Pid | None = None
    argv: list[str] = []
    python: str | None = None
    framework: str | None = None
    framework_version: str | None = None
    state: str = "running"  # running | profiling | stopping | ok | exception | signal
    detail: str | None = None
    started_ns: int | None = None
    ended_ns: int | None = None
    clock: Clock = msgspec.field(default_factory=Clock)
    trace_files: list[str] = []
    profiled_steps: int = 0
    # the profile window (0: collect's own; K: asked with traceview profile), the job's step
    # of its first recorded step and the step its profile began in (null: not said)
    window: int = 0
    first_step: int | None = None
    began_step: int | None = None
    user_profiler: bool = False
    notes: list[str] = []
    role: str | None = None  # a parameter-server job's DMLC_ROLE: worker, server, scheduler
    kvstore: str | None = None  # an MXNet job's KVStore type (dist_sync, dist_async...)
    stop_reason: str | None = None  # why the profile stopped before its --steps (memory cap)
    stop_step: int | None = None  # the profiler's step then
    stop_mid_step: bool = False  # that step was cut short
    # [time_ns, resident bytes] at each step boundary while profiling (collect, PyTorch)
    rss_samples: list[list[int]] = []
    proc_start: Ticks | None = None  # /proc/<pid>/stat's start time (clock ticks since boot)


def read_status(path: Path, unused: tuple[str, ...] = ()) -> tuple[RankStatus, str | None]:
    """The status.json at ``path`` (written by a rank of the job: untrusted), and what was wrong
    with it (None: nothing). What reads is kept, field by field (``lenient``); a file that is
    not a regular file, is larger than ``MAX_STATUS_BYTES``, is not JSON (invalid UTF-8, nested
    too deep, a number too long) or not an object gives an empty status. Fields in ``unused``
    are not named when they do not read (a parameter server's rank, -1). ``FileNotFoundError``
    is raised for a missing one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO must not block)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return RankStatus(), f"unreadable, not used ({exc.strerror or exc})"
    with os.fdopen(fd, "rb") as file:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return RankStatus(), "not a regular file, not used"
            data = file.read(MAX_STATUS_BYTES + 1)
        except OSError as exc:
            return RankStatus(), f"unreadable, not used ({exc.strerror or exc})"
    if len(data) > MAX_STATUS_BYTES:
        return RankStatus(), f"larger than {MAX_STATUS_BYTES >> 20} MiB, not used"
    try:
        decoded = json.loads(data)
    except RecursionError:
        return RankStatus(), "unreadable, not used (nested too deeply)"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a number too long
        return RankStatus(), f"unreadable, not used ({str(exc)[:200]})"
    if not isinstance(decoded, dict):
        return RankStatus(), f"not a JSON object (a {type(decoded).__name__}), not used"
    status, dropped = lenient(decoded, RankStatus)
    dropped = [name for name in dropped if name not in unused]
    if dropped:
        shown = ", ".join(dropped[:5]) + (
            f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        )
        return status, f"field(s) {shown} of the wrong type or out of range, not used"
    return status, None


class CollectedRank(Record):
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    state: str | None = None  # as the status says, or crashed/unknown if it never ended
    detail: str | None = None
    trace: bool = False
    framework: str | None = None
    framework_version: str | None = None
    clock: Clock = msgspec.field(default_factory=Clock)
    rank_source: str | None = None
    user_profiler: bool = False
    profiled_steps: int | None = None  # steps recorded in full (null: not said)
    stop_reason: str | None = None  # why the profile stopped before its --steps (memory cap)
    stop_step: int | None = None  # the profiler's step then
    stop_mid_step: bool = False  # that step was cut short (it is left out of the figures)
    notes: list[str] = []
    kvstore: str | None = None  # an MXNet job's KVStore type (dist_sync, dist_async...)


class CollectedProcess(Record):
    """A process of the job that is not a rank (a parameter server, a scheduler)."""

    role: str | None = None
    trace: bool = False  # it wrote a profile (a server profiled through the workers' KVStore)
    host: str | None = None
    pid: int | None = None
    state: str | None = None
    detail: str | None = None
    framework: str | None = None


class Schedule(Record):
    skip: int | None = None
    warmup: int | None = None
    steps: int | None = None
    max_memory: int | None = None  # bytes a rank's profile may grow by (0: no cap)


class Collected(Record):
    """The manifest's "collect" section: what ``traceview collect`` ran and how it ended."""

    command: list[str] = []
    launched: list[str] = []
    exit_code: int | None = None
    interrupted: str | None = None
    start: str | None = None
    end: str | None = None
    seconds: float | None = None
    schedule: Schedule = msgspec.field(default_factory=Schedule)
    world_size: WorldSize | None = None
    hosts: list[str] = []
    ranks: list[CollectedRank] = []
    processes: list[CollectedProcess] = []
    traceview_version: str | None = None
    python: str | None = None


def lenient(data: Any, kind: type[R]) -> tuple[R, list[str]]:
    """``data`` (decoded JSON) as ``kind``, keeping every field that reads and leaving the rest
    at their defaults: one odd value written by a job must not cost the rest of its record.
    Returns the record and the names of the fields left out."""
    if not isinstance(data, dict):
        return kind(), ["(not an object)"]
    try:
        return msgspec.convert(data, kind, strict=False), []
    except msgspec.ValidationError:
        pass
    records = {
        f.encode_name: f.type
        for f in msgspec.structs.fields(kind)
        if isinstance(f.type, type) and issubclass(f.type, Record)
    }
    good: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in data.items():
        try:
            msgspec.convert({key: value}, kind, strict=False)
        except msgspec.ValidationError:
            if key in records and isinstance(value, dict):  # a record inside: keep what reads
                inner, lost = lenient(value, records[key])
                good[key] = msgspec.to_builtins(inner)
                dropped.extend(f"{key}.{name}" for name in lost)
            else:
                dropped.append(key)
        else:
            good[key] = value
    return msgspec.convert(good, kind, strict=False), dropped


def collected(section: dict[str, Any]) -> Collected:
    """The launcher's "collect" section (built from the ranks' status files) as a record; a
    rank's or process's odd field is left at its default rather than losing the job's record."""
    section = dict(section)
    for key, kind in (("ranks", CollectedRank), ("processes", CollectedProcess)):
        entries = section.get(key)
        if isinstance(entries, list):
            section[key] = [msgspec.to_builtins(lenient(e, kind)[0]) for e in entries]
    return lenient(section, Collected)[0]


class RankIngest(Record):
    """One rank as ingest read it."""

    rank: int
    source: str | None = None
    # every file of a rank that wrote several (one per profiler cycle or step), in time order
    trace_files: list[str] = []
    format: str | None = None
    framework: str | None = None
    host: str | None = None
    status: str = "ok"  # ok | truncated
    events: int = 0
    bytes_read: int = 0
    lost_bytes: int = 0
    skipped_records: dict[str, int] = {}
    steps: int = 0  # step markers found on the training thread
    training_thread: list[int] | None = None  # [pid, tid]
    threads: dict[str, str] = {}  # "pid/tid" -> name
    clock_offset_ns: int = 0
    clock: Clock = msgspec.field(default_factory=Clock)
    meta: dict[str, Any] = {}  # what the trace says: backend, devices, versions, batch size...
    seconds: float = 0.0
    worker: str | None = None  # the Dask worker that ingested it (None: a local process)
    # a parameter-server job's: worker, server, scheduler or chief (None: a peer of the
    # collectives), and how it was known (collect's DMLC_ROLE or TF_CONFIG, or the trace)
    role: str | None = None
    role_from: str | None = None


class ManifestNotes(Record):
    warnings: list[str] = []
    remarks: list[str] = []


class Manifest(Record):
    """manifest.json."""

    traceview_version: str | None = None
    schema_version: str | None = None
    run_id: str | None = None
    created: str | None = None
    command: list[str] = []
    inputs: list[str] = []
    # the Flight Recorder dumps found among the inputs (read by the report for how the job
    # ended); None: a run ingested before they were listed, whose inputs are looked through
    flight_dumps: list[str] | None = None
    framework: str | None = None
    world_size: WorldSize | None = None
    ranks_present: list[int] = []
    missing_ranks: list[int] = []
    ranks: list[RankIngest] = []
    notes: ManifestNotes = msgspec.field(default_factory=ManifestNotes)
    ingest_seconds: float | None = None
    analysis_version: str | None = None  # of the cached analysis tables
    collect: Collected | None = None
    # a profile window asked of a running job (RUN/windows/K: K; its step record is RUN's);
    # null: the run's own (collect's first window)
    window: int | None = None

    def threads(self) -> dict[int, dict[str, str]]:
        """Thread names of each rank."""
        return {r.rank: dict(r.threads) for r in self.ranks}
