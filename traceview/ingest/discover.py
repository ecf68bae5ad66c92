"""Find the traces under the paths a user gives and identify each cheaply (its parser,
rank, world size, host, clock offset from collect's status file), so ranks are fixed before
any heavy work.
"""

from __future__ import annotations

import dataclasses
import errno
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from traceview.model.errors import (
    BadInput,
    Notes,
    UsageError,
)
from traceview.model.escape import safe
from traceview.model.manifest import (
    MAX_WORLD_SIZE,
    SERVICE_ROLES,
    Clock,
    RankStatus,
    read_status,
    role_named,
)
from traceview.model.progress import Progress, quiet
from traceview.parsers import (
    SURE_PID,
    ParsedTrace,
    Parser,
    TraceIdentity,
    TraceStream,
    generic,
    number_ranges,
    rank_from_filename,
    registered,
)
from traceview.parsers.chrome_stream import read_head
from traceview.store import rundir as R


class NoTraces(BadInput):
    """A folder that holds no trace (it may hold other things a report reads: dumps)."""


@dataclass
class TraceFile:
    path: Path
    parser: str
    framework: str
    rank: int = -1
    claimed_rank: int | None = None
    world_size: int | None = None
    host: str | None = None
    size: int = 0
    clock: Clock = field(default_factory=Clock)  # from the status beside it (collect's runs)
    # the rank's other files, where it wrote one per profiler cycle or step (one process's
    # windows: ingest reads them as one trace, in time order)
    more: list[Path] = field(default_factory=list)
    process: int | None = None  # the OS process that wrote it, where the trace says cheaply
    # the devices of a process that drove several, each a rank (``per_device``); ``device``:
    # the one this rank is
    devices: list[str] | None = None
    device: str | None = None
    # the process's role in a parameter-server job as collect recorded it (DMLC_ROLE...)
    role: str | None = None
    # ``more`` holds files named by step number (``_step_numbered``), not profiler windows
    by_step_name: bool = False

    @property
    def files(self) -> list[Path]:
        return [self.path, *self.more]


#: What `traceview collect` writes beside each rank's trace.
RANK_STATUS = "status.json"


def _candidates(folder: Path, notes: Notes | None = None) -> list[Path]:
    """The regular files under ``folder`` (hidden ones left out); a FIFO, socket or device
    among them is never opened (it could block), and named in ``notes``."""
    files, special = [], []
    below = len(folder.parts)  # (parts, not relative_to, and sorted by them: as fast for 20,000)
    for p in sorted(folder.rglob("*"), key=lambda found: found.parts):
        if any(part.startswith(".") for part in p.parts[below:]):
            continue
        try:
            mode = p.stat().st_mode
        except OSError:  # a dangling link, a loop: nothing to read
            continue
        if stat.S_ISREG(mode):
            if p.name != RANK_STATUS:  # (read beside its trace, not as one)
                files.append(p)
        elif not stat.S_ISDIR(mode):
            special.append(f"{p.relative_to(folder)} ({R.special_kind(mode)})")
    if special and notes is not None:
        more = f" and {len(special) - 3} more" if len(special) > 3 else ""
        notes.warn(f"not opened, not regular files: {', '.join(special[:3])}{more}")
    return files


def rank_status(trace: Path, notes: Notes | None = None) -> RankStatus:
    """The status `traceview collect` wrote beside a trace (empty when there is none). Fields
    that do not read are left at their defaults, with a warning in ``notes``: the trace and the
    rest of the status (its clock offset above all) are used all the same."""
    path = trace.parent / RANK_STATUS
    try:  # (a process that is not a rank, an MXNet server, says rank -1)
        status, problem = read_status(
            path, () if trace.parent.name.startswith("rank-") else ("rank",)
        )
    except FileNotFoundError:
        return RankStatus()
    if problem and notes is not None:
        notes.warn(f"{path}: {problem}")
    return status


def discover(
    paths: list[Path],
    notes: Notes,
    rules_given: bool = False,
    progress: Progress = quiet,
    dumps_found: list[Path] | None = None,
) -> list[TraceFile]:
    """The traces among ``paths``; a named file that is not a trace is an error. With a rules
    file (``rules_given``), a Chrome trace that no parser claims is read by the generic one.
    Each file is looked at once (its head), so a folder of many files takes time in proportion,
    told to ``progress``. The Flight Recorder dumps in the folders go to ``dumps_found``."""
    parsers = registered()
    if rules_given:
        parsers = [*parsers, _Fallback(generic())]
    found: list[TraceFile] = []
    skipped: list[str] = []
    dumps: list[str] = []  # (not traces: Flight Recorder dumps, read by the report)
    damaged: list[str] = []
    for path in paths:
        try:
            mode = path.stat().st_mode  # (links followed)
        except FileNotFoundError:
            raise UsageError(R.parked_hint(path) or f"{path}: no such file or directory") from None
        except OSError as exc:  # a loop of links, a folder this user may not look into
            why = "a loop of symbolic links" if exc.errno == errno.ELOOP else "cannot read"
            raise BadInput(f"{path}: {why} ({exc.strerror or exc})") from None
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):  # never opened: it could block
            raise BadInput(f"{path}: {R.special_kind(mode)}, not a trace file; not opened")
        if stat.S_ISDIR(mode):
            folder = path / R.RAW if R.is_run_dir(path) and (path / R.RAW).is_dir() else path
            candidates = _candidates(folder, notes)
            for done, candidate in enumerate(candidates):
                progress("looking at files", done, len(candidates))
                try:
                    trace = _identify(candidate, parsers, notes)
                except BadInput as exc:  # one damaged file does not cost the folder's others
                    damaged.append(str(exc))
                    continue
                if trace is None:
                    name = str(candidate.relative_to(folder))
                    if _is_dump(candidate):
                        dumps.append(name)
                        if dumps_found is not None:
                            dumps_found.append(candidate.resolve())
                    else:
                        skipped.append(name)
                else:
                    found.append(trace)
            if not found:
                reason = f" ({damaged[0]}{' …' if len(damaged) > 1 else ''})" if damaged else ""
                what = "no readable traces" if damaged else "no traces"
                raise NoTraces(f"{path}: {what} found in this folder{reason}")
        else:
            trace = _identify(path, parsers, notes)
            if trace is None:
                raise BadInput(
                    f"{path}: not a trace traceview can read (expected PyTorch/Kineto JSON, "
                    "TensorFlow .xplane.pb or Timeline JSON, MXNet profiler JSON or traceview "
                    "collect's Chainer JSON; any other Chrome trace with --rules)"
                )
            found.append(trace)
    for problem in damaged:
        notes.warn(f"{problem}: left out")
    if skipped:
        notes.remark(f"skipped {len(skipped)} file(s) that are not traces: {_some(skipped)}")
    if dumps and found:
        notes.remark(
            f"{len(dumps)} Flight Recorder dump(s) beside the traces, read for how the job "
            f"ended: {_some(dumps)}"
        )
    return found


def _some(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _is_dump(path: Path) -> bool:
    """Whether a file that is no trace is a Flight Recorder dump (its head says so)."""
    from traceview.parsers.flight import HEAD_BYTES, dump_form

    try:
        with open(path, "rb") as f:
            return dump_form(f.read(HEAD_BYTES)) is not None
    except OSError:
        return False


class _Fallback:
    """The generic Chrome-trace parser, claiming whatever looks like a Chrome trace."""

    def __init__(self, parser: Parser):
        self.parser = parser
        self.name, self.framework = parser.name, parser.framework
        self.streams, self.rules_file = parser.streams, parser.rules_file

    def sniff(self, path: Path, head: bytes) -> bool:
        from traceview.parsers.generic_chrome import looks_like_chrome_trace

        return looks_like_chrome_trace(head)

    def identify(self, path: Path) -> TraceIdentity:
        return self.parser.identify(path)

    def parse(self, path: Path) -> ParsedTrace:
        return self.parser.parse(path)

    def stream(self, path: Path) -> TraceStream:
        return self.parser.stream(path)


def _identify(path: Path, parsers: list[Parser], notes: Notes) -> TraceFile | None:
    try:
        if path.stat().st_size == 0:
            raise BadInput(f"{path}: empty file")
        head = read_head(path)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    parser = next((p for p in parsers if p.sniff(path, head)), None)
    if parser is None:
        return None
    identity = parser.identify(path)
    status = rank_status(path, notes)
    rank = _believed(identity.rank, 0, MAX_WORLD_SIZE - 1, "rank", path, notes)
    world = _believed(identity.world_size, 1, MAX_WORLD_SIZE, "world size", path, notes)
    return TraceFile(
        path=path,
        parser=parser.name,
        framework=getattr(identity, "framework", None) or parser.framework,
        claimed_rank=rank if rank is not None else status.rank,
        world_size=world or status.world_size,
        host=identity.host or status.host,
        size=path.stat().st_size,
        clock=status.clock,
        process=getattr(identity, "process", None),  # (a plugin's identity may predate it)
        devices=getattr(identity, "devices", None),
        role=status.role,
    )


def _believed(
    value: int | None, least: int, most: int, what: str, path: Path, notes: Notes
) -> int | None:
    """A rank or world size as a trace states it, unless it is absurd (memory follows the world
    size): then it is ignored with a warning, and the rank comes from the file name or order."""
    if value is None or least <= value <= most:
        return value
    shown = str(value) if len(str(value)) <= 24 else f"{str(value)[:21]}..."
    notes.warn(f"{path}: the {what} the trace states ({shown}) is outside {least}-{most}: ignored")
    return None


def _one_process_one_trace(traces: list[TraceFile]) -> None:
    """Traces that state no rank, of one format, host and process (a job without a process
    group that wrote a file per profiler cycle or step): one trace, its other files in
    ``more``, the rest leave ``traces``. A small pid on no stated host is no identity: every
    container's first process has it."""
    first: dict[tuple[str, str | None, int], TraceFile] = {}
    kept = []
    for trace in traces:
        anonymous = trace.host is None and (trace.process or 0) < SURE_PID
        if trace.claimed_rank is not None or trace.process is None or anonymous:
            kept.append(trace)
            continue
        key = (trace.parser, trace.host, trace.process)
        if key in first:
            first[key].more.append(trace.path)
            first[key].size += trace.size
            continue
        first[key] = trace
        kept.append(trace)
    traces[:] = kept


#: A step's (or iteration's) number in a file name: ``timeline_step_3.json``, ``iter-12.pt.trace.json``.
_STEP_IN_NAME = re.compile(r"(?i)(?<![a-z])(step|iter|iteration)([_-]?)(\d+)(?!\d)")


def _step_numbered(traces: list[TraceFile], notes: Notes) -> None:
    """Traces that state no rank and no process (a TensorFlow 1 Timeline states neither), of one
    format, in one folder, whose names differ only in a step's number (the Timeline recipe's
    ``timeline_step_%d.json``, a file per ``Session.run``): one process's steps, not ranks. They
    become one trace, its other files in ``more`` (read in time order); the rest stay."""
    groups: dict[tuple[str, Path, str], list[tuple[int, TraceFile]]] = {}
    for trace in traces:
        if trace.claimed_rank is not None or trace.process is not None or trace.host is not None:
            continue
        found = list(_STEP_IN_NAME.finditer(trace.path.name))
        if len(found) != 1:
            continue
        match = found[0]
        stem = f"{trace.path.name[: match.start(3)]}N{trace.path.name[match.end(3) :]}"
        key = (trace.parser, trace.path.parent, stem)
        groups.setdefault(key, []).append((int(match.group(3)), trace))
    gone: set[int] = set()
    for (_, folder, stem), members in groups.items():
        numbers = [n for n, _ in members]
        if len(members) < 2 or len(set(numbers)) < len(numbers):
            continue
        members.sort(key=lambda member: member[0])
        first = members[0][1]
        first.by_step_name = True
        for _, trace in members[1:]:
            first.more.append(trace.path)
            first.size += trace.size
            gone.add(id(trace))
        shown = safe(str(folder / stem), 160)
        notes.remark(
            f"{shown}: {len(members)} files named by step number ({min(numbers)}-{max(numbers)}), "
            "read as one process's steps in time order (the traces state no rank or process)"
        )
    traces[:] = [t for t in traces if id(t) not in gone]


def _differ(first: TraceFile, other: TraceFile) -> str:
    """What tells two traces of one rank apart as different processes ("" where nothing)."""
    if first.parser != other.parser:
        return f"one {first.parser}, the other {other.parser}"
    for what, a, b in (
        ("host", first.host, other.host),
        ("world size", first.world_size, other.world_size),
    ):
        if a is not None and b is not None and a != b:
            return f"of {what} {a!r} and {b!r}"
    if first.process is not None and other.process is not None and first.process != other.process:
        return f"written by different processes (pid {first.process} and pid {other.process})"
    return ""


def assign_ranks(traces: list[TraceFile], notes: Notes) -> int | None:
    """Fix each trace's rank: what the trace says, else its file name, else its order.

    Several traces that say they are one rank, of one host and format, are that rank's windows
    (a profiler that wrote one file per cycle or per step): they become one ``TraceFile``, its
    other files in ``more``, and leave ``traces``. Returns the world size (the largest any trace
    states) and warns about missing ranks.
    """
    by_rank: dict[int, TraceFile] = {}
    for trace in traces:
        if trace.claimed_rank is None:
            continue
        if trace.claimed_rank in by_rank:
            other = by_rank[trace.claimed_rank]
            why = _differ(other, trace)
            if why:
                raise BadInput(
                    f"two traces say they are rank {trace.claimed_rank}: {other.path} and "
                    f"{trace.path}, {why} (traces of different runs? ingest one "
                    "run at a time)"
                )
            other.more.append(trace.path)
            other.size += trace.size
            continue
        by_rank[trace.claimed_rank] = trace
        trace.rank = trace.claimed_rank
    traces[:] = [t for t in traces if t.claimed_rank is None or by_rank[t.claimed_rank] is t]
    _one_process_one_trace(traces)
    _step_numbered(traces, notes)
    # a parameter server (collect says so) is no worker: numbered after them, in file order
    serving = [t for t in traces if t.claimed_rank is None and role_named(t.role) in SERVICE_ROLES]
    unclaimed = [t for t in traces if t.claimed_rank is None and t not in serving]
    # File names are used only when they number every remaining trace without collisions.
    named = {t.path: rank_from_filename(t.path) for t in unclaimed}
    ranks = [r for r in named.values() if r is not None]
    distinct = len(ranks) == len(unclaimed) and len(set(ranks)) == len(ranks)
    if unclaimed and distinct and not set(ranks) & set(by_rank):
        for trace in unclaimed:
            rank = named[trace.path]
            assert rank is not None
            trace.rank = rank
            by_rank[rank] = trace
        unclaimed = []
        notes.remark("ranks taken from the file names (the traces do not state them)")
    next_rank = 0
    for trace in unclaimed:
        while next_rank in by_rank:
            next_rank += 1
        trace.rank = next_rank
        by_rank[next_rank] = trace
    if unclaimed and len(traces) > 1:
        notes.remark("ranks numbered in file order (neither the traces nor their names state them)")
    workers = set(by_rank)
    next_rank = max(by_rank, default=-1) + 1
    for trace in serving:
        trace.rank = next_rank
        by_rank[next_rank] = trace
        next_rank += 1
    several = sorted(r for r, t in by_rank.items() if t.more and not t.by_step_name)
    if several:
        low, high = (
            min(len(by_rank[r].files) for r in several),
            max(len(by_rank[r].files) for r in several),
        )
        counts = str(low) if low == high else f"{low}-{high}"
        notes.remark(
            f"rank(s) {number_ranges(several)}: {counts} trace files each (one per profiler cycle "
            "or step), read as one trace per rank, in time order"
        )
        windowed = [t for t in by_rank.values() if not t.by_step_name]
        most = max(len(t.files) for t in windowed)
        fewer = sorted(t.rank for t in windowed if len(t.files) < most)
        if fewer:
            notes.warn(
                f"rank(s) {number_ranges(fewer)} have fewer trace files than the {most} of rank(s) "
                f"{number_ranges(sorted({t.rank for t in windowed} - set(fewer)))} (they stopped early, or "
                "files are missing): each is analysed up to where its traces stop, and a step "
                "missing from some ranks is left out of every figure"
            )
    worlds = [t.world_size for t in traces if t.world_size]
    world = max(worlds) if worlds else None
    present = sorted(workers)
    beyond = [r for r in present if world is not None and r >= world]
    if beyond:
        notes.warn(
            f"rank(s) {number_ranges(beyond)} at or beyond the world size {world} the traces "
            "state: traces of another run, or a world size recorded wrong?"
        )
    if world is not None and world > len(present):
        missing = sorted(set(range(world)) - set(present))
        notes.warn(
            f"world size {world} but {len(present)} trace(s) given: missing rank(s) {number_ranges(missing)}; "
            f"reporting rank(s) {number_ranges(present)} only"
        )
    return world


def per_device(traces: list[TraceFile], world: int | None, notes: Notes) -> int | None:
    """Each device of a process that drove several (a mirrored strategy, JAX) a rank of its
    own, the others' ranks after them: a process's devices take consecutive ranks in the order
    of the processes' ranks (``assign_ranks``), its devices in order. Returns the world size
    in devices (the processes' world, where no process drove several)."""
    if not any(t.devices for t in traces):
        return world
    expanded: list[TraceFile] = []
    for trace in sorted(traces, key=lambda t: t.rank):
        devices: list[str | None] = [*trace.devices] if trace.devices else [None]
        for device in devices:
            rank = len(expanded)
            expanded.append(
                dataclasses.replace(trace, rank=rank, device=device, more=list(trace.more))
            )
    several = [t for t in traces if t.devices]
    shown = ", ".join(
        f"{t.path.name} ({len(t.devices or [])}: {', '.join((t.devices or [])[:4])}"
        f"{' ...' if len(t.devices or []) > 4 else ''})"
        for t in several[:3]
    )
    notes.remark(
        f"one process drove several devices: each device is a rank ({len(expanded)} in all): "
        f"{shown}{' and more' if len(several) > 3 else ''}"
    )
    traces[:] = expanded
    return len(expanded)
