"""Opening what the user points at as a run: traces ingested into a temporary run directory, a
run directory read as it is (its cache checked), several runs with labels of their own."""

from __future__ import annotations

import copy
import importlib
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from traceview.analysis import ANALYSIS_VERSION, RANK_TABLES, rank_tables
from traceview.ingest.discover import NoTraces
from traceview.model.columns import TableOnDemand, Within
from traceview.model.errors import BadInput, OutputError, UsageError, cannot_write
from traceview.model.escape import safe
from traceview.model.manifest import Manifest, ManifestNotes
from traceview.model.progress import Progress, quiet
from traceview.model.results.live import ProfileWindow
from traceview.runs.cache import RunReplaced, _current, _key, _read_tables
from traceview.runs.handle import Run, flight_dumps
from traceview.runs.reanalysis import _reanalyzed, reanalyze
from traceview.runs.windows import job_ended, list_windows, window_path
from traceview.store import rundir as R
from traceview.store.scratch import scratch_parent

if TYPE_CHECKING:
    from traceview.model.choice import StepChoice


def _label(paths: list[Path]) -> str:
    # (not resolve(): a loop of links is for reading it to say, not for naming it)
    path = Path(os.path.abspath(paths[0]))
    try:
        name = path.name if path.is_dir() else path.parent.name
    except OSError:  # not ours to look into: reading it will say so
        name = path.name
    return name + (f" (+{len(paths) - 1})" if len(paths) > 1 else "")


#: What the analyses of an ingest import: where a profile is converted in a child process
#: (TensorFlow's), imported while it converts
_ANALYSES = (
    "polars",
    "traceview.analysis.parts",
    "traceview.analysis.summary.assemble",
    "traceview.analysis.crossrank.driver",
    "traceview.analysis.critical_path.report",
)


def _import_analyses() -> None:
    for name in _ANALYSES:
        importlib.import_module(name)


def ingest_run(paths: list[Path], out: Path, **options: Any) -> Path:
    """``ingest.ingest`` with the per-rank analysis: the events and the analysis tables."""
    from traceview.ingest.run import ingest
    from traceview.parsers.native_child import while_waiting

    while_waiting("analyses", _import_analyses)
    return ingest(paths, out, analyze=rank_tables, analysis_version=ANALYSIS_VERSION, **options)


#: How often a run directory that an ingest keeps replacing is read again before giving up.
READ_TRIES = 3


@contextmanager
def open_run(
    paths: list[Path],
    rules: Path | None = None,
    progress: Progress = quiet,
    choice: StepChoice | None = None,
    window: int | None = None,
) -> Iterator[Run]:
    """The run at ``paths``; traces are read into a temporary run directory. ``choice``: the
    steps its reports count (--steps/--skip; the analysis tables hold every step, so a cached
    analysis serves any choice). ``window``: of a run collect made, its profile window (None:
    the newest complete one; runs.windows)."""
    label = _label(paths)
    if len(paths) == 1 and (window is not None or has_windows(paths[0])):
        chosen, which = choose_window(paths[0], window)
        if which is not None and (window is not None or which.window):
            steps = f" (steps {which.first_step}-{which.last_step})" if which.last_step else ""
            label = f"{label} w{which.window}{steps}"
        paths = [chosen]
    if len(paths) == 1 and _record_only(paths[0]):
        opened = _open_record_only(paths[0], label)
        opened.choice = choice
        yield opened
        return
    if len(paths) == 1 and R.is_run_dir(paths[0]) and R.event_ranks(paths[0]) and rules is None:
        opened = _open_dir(paths[0], label, progress)
        opened.choice = choice
        try:
            yield opened
        finally:
            opened.segments.close()
        return
    try:
        scratch, run = _ingested(paths, rules, progress)
    except NoTraces as exc:
        dumps = flight_dumps(paths)
        if dumps is None:
            raise
        if not dumps.dumps:  # (only dumps set aside: say why, in the one line)
            raise NoTraces(f"{exc}; {dumps.warnings[0]}") from None
        opened = _dumps_only(paths, label, len(dumps.dumps))
        opened.choice = choice
        yield opened
        return
    with scratch:
        opened = Run(run, label, R.read_manifest(run), *_read_tables(run), True, choice)
        try:
            yield opened
        finally:
            opened.segments.close()


def _ingested(
    paths: list[Path], rules: Path | None, progress: Progress
) -> tuple[tempfile.TemporaryDirectory[str], Path]:
    """``paths`` ingested into a temporary run: in shared memory where they are small and it
    has room (``store.scratch``), else in the default temporary place (``TMPDIR`` chooses
    another), or there after all where shared memory could not take the run (it filled)."""
    shared = scratch_parent(paths)
    if shared is not None:
        try:
            return _ingested_in(shared, paths, rules, progress)
        except OutputError:
            pass
    return _ingested_in(None, paths, rules, progress)


def _ingested_in(
    place: str | None, paths: list[Path], rules: Path | None, progress: Progress
) -> tuple[tempfile.TemporaryDirectory[str], Path]:
    try:
        scratch = tempfile.TemporaryDirectory(prefix="traceview-", dir=place)
    except OSError as exc:
        raise cannot_write(place or tempfile.gettempdir(), exc) from None
    try:
        out = Path(scratch.name) / "run"
        return scratch, ingest_run(
            paths, out, rules_path=rules, command=sys.argv, progress=progress
        )
    except BaseException:
        scratch.cleanup()
        raise


def choose_window(run: Path, window: int | None) -> tuple[Path, ProfileWindow | None]:
    """The folder of window ``window`` of ``run`` (None: the newest complete one, else the
    run itself) and the window, ingested where it was not yet. UsageError where there is no
    such window; BadInput where it is being written."""
    if window is None and not has_windows(run):
        return run, None
    windows = {w.window: w for w in list_windows(run, job_ended=job_ended(run))}
    if window is None:
        complete = [w.window for w in windows.values() if w.state == "complete" and w.window]
        if not complete:
            return run, windows.get(0)
        window = max(complete)
    if window == 0:
        if 0 not in windows and not (run / R.MANIFEST).is_file():
            raise UsageError(f"{run}: no profile window 0 (not a run collect made)")
        return run, windows.get(0)
    found = windows.get(window)
    if found is None:
        have = ", ".join(str(k) for k in sorted(windows)) or "none"
        raise UsageError(f"{run}: no profile window {window} (windows: {have})")
    folder = window_path(run, window)
    try:  # (what a run holds is untrusted: a window read, and cached, only inside it)
        inside = run.resolve() in folder.resolve().parents
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        raise BadInput(f"{folder}: a link out of the run; a profile window is read only inside it")
    if found.state in ("asked", "missed"):
        raise BadInput(
            f"{run}: profile window {window} has no profile yet"
            + (" (the job ended before its steps)" if found.state == "missed" else "")
        )
    if found.state == "partial" and not job_ended(run):
        raise BadInput(
            f"{run}: profile window {window} is being written ({found.ranks} rank(s) so far); "
            "read it once it is complete"
        )
    if not R.is_run_dir(folder) or not R.event_ranks(folder):
        _ingest_window(run, folder, window)
    return folder, found


def _ingest_window(run: Path, folder: Path, window: int) -> None:
    """Window ``window``'s traces read into its folder (a manifest naming the window first,
    with the run's collect section where the job has ended)."""
    collect = R.read_manifest(run).collect if R.is_run_dir(run) else None
    R.write_manifest(
        folder, Manifest(command=["traceview", "profile"], collect=collect, window=window)
    )
    ingest_run([folder], folder, command=["traceview", "profile", str(run)])


def has_windows(path: Path) -> bool:
    """Whether ``path`` holds profile windows asked of its job (False where it cannot be
    looked into: reading it says why)."""
    try:
        return (path / R.WINDOWS).is_dir()
    except OSError:
        return False


def _record_only(path: Path) -> bool:
    """Whether ``path`` is a run directory `collect` made whose ranks wrote no trace but kept a
    step record (a job that died before its profiled window): its report is the record's."""
    if not R.is_run_dir(path) or R.event_ranks(path):
        return False
    raw = path / R.RAW
    try:
        from traceview.collectors.record_rows import has_steps

        recorded = any(has_steps(p) for p in raw.glob("rank-*/steps.bin"))
        traced = any(raw.glob("rank-*/*.json*")) and any(
            p.name.endswith((".pt.trace.json", ".pt.trace.json.gz", ".json.gz", ".xplane.pb"))
            for p in raw.glob("rank-*/*")
        )
    except OSError:
        return False
    return recorded and not traced


def _open_record_only(run: Path, label: str) -> Run:
    """A run of no trace, only its step record: empty analysis tables, its manifest as
    `collect` wrote it."""
    manifest = R.read_manifest(run)
    if not manifest.notes.remarks or "no rank wrote a trace" not in manifest.notes.remarks[0]:
        manifest.notes.remarks.insert(
            0,
            "no rank wrote a trace (the job ended before its profiled window): what follows is "
            "its step record's account only",
        )
    tables = {name: schema.empty_table() for name, schema in RANK_TABLES.items()}
    segments = TableOnDemand.of(RANK_TABLES["segments"].empty_table())
    return Run(run, label, manifest, tables, segments, False)


def _dumps_only(paths: list[Path], label: str, ranks: int) -> Run:
    """Flight Recorder dumps with no trace beside them: a run of no rank's events, whose report
    is the dumps' account (``Run.step_record`` reads them from ``inputs``)."""
    manifest = Manifest(
        command=sys.argv,
        inputs=[str(p) for p in paths],
        notes=ManifestNotes(
            remarks=[
                f"no traces, {ranks} rank(s)' Flight Recorder dumps: what follows is their "
                "account only (each rank's last collectives)"
            ]
        ),
    )
    tables = {name: schema.empty_table() for name, schema in RANK_TABLES.items()}
    segments = TableOnDemand.of(RANK_TABLES["segments"].empty_table())
    return Run(paths[0], label, manifest, tables, segments, True)


def _open_dir(run: Path, label: str, progress: Progress = quiet) -> Run:
    """A run directory: its cached analysis where the cache is this run's and current, else
    recomputed from the events. Read again (up to READ_TRIES times) where an ingest replaced it
    while it was read, so what is shown is one run, never a mix of two."""
    for _ in range(READ_TRIES):
        seen = R.identities(run)  # (first: any change after this is seen at the end)
        manifest = R.read_manifest(run)
        try:
            read = _read_tables(run, _key(manifest, seen)) if _current(manifest, seen) else None
        except BadInput:  # a damaged, stale or foreign cache: it is only a cache
            read = None
        try:
            if read is not None:
                tables, segments = read[0], _or_recomputed(read[1], run, manifest, seen)
            else:
                tables, segments = _reanalyzed(run, manifest, seen, progress)
            return Run(
                run, label, manifest, tables, segments, False, cache_key=_key(manifest, seen)
            )
        except RunReplaced:
            continue
    raise BadInput(
        f"{run}: replaced while it was read, {READ_TRIES} times (an ingest into it is running?); "
        "run again when it ends"
    )


def _or_recomputed(
    segments: TableOnDemand, run: Path, manifest: Manifest, seen: dict[str, R.Identity]
) -> TableOnDemand:
    """The cached segments, opened with the other tables and read later; where they cannot be
    read then (a damaged cache whose footer was whole: it is only a cache), the run's analysis
    computed again from its events and the cache replaced, as at open, provided the run on
    disk is still the one opened (else BadInput: one run, never a mix of two)."""

    def recomputed() -> pa.Table:
        try:
            # (a copy: the run's manifest stays the one its other tables were read with)
            return reanalyze(run, copy.deepcopy(manifest), seen)["segments"]
        except RunReplaced:
            raise BadInput(
                f"{run}: replaced while it was read (an ingest into it is running?); "
                "run again when it ends"
            ) from None

    again: list[pa.Table] = []  # the segments computed again, once they were

    def read() -> pa.Table:
        if again:
            return again[0]
        try:
            return segments.read()
        except BadInput:
            again.append(recomputed())
            return again[0]

    def pieces(within: Within | None) -> Iterator[pa.Table]:
        """The cached pieces; from the first that cannot be read, the rest of the rows
        computed again (the same rows in the same order: the cache's key says so)."""
        if again:
            yield again[0]
            return
        try:
            yield from segments.in_pieces(within)
        except R.UnreadableRows as exc:
            again.append(recomputed())
            yield again[0].slice(exc.offset)

    return TableOnDemand(segments.num_rows, read, segments.close, pieces)


@contextmanager
def open_runs(
    groups: list[list[Path]],
    rules: Path | None = None,
    progress: Progress = quiet,
    labels: list[str] | None = None,
    choice: StepChoice | None = None,
    windows: list[int | None] | None = None,
) -> Iterator[list[Run]]:
    """Several runs at once (compare, scaling); labels made unique, or the ``labels`` given
    (one per run, all different). ``windows``: each run's profile window (open_run)."""
    if labels:
        if len(labels) != len(groups):
            raise UsageError(f"{len(labels)} --label for {len(groups)} runs: give one per run")
        if len(set(labels)) < len(labels):
            twice = next(label for label in labels if labels.count(label) > 1)
            raise UsageError(f"--label {safe(twice)!r} given twice: each run needs its own")
    with ExitStack() as stack:
        chosen = windows or [None] * len(groups)
        runs = [
            stack.enter_context(open_run(paths, rules, progress, choice, window))
            for paths, window in zip(groups, chosen, strict=True)
        ]
        # Same folder name in different frameworks' trees (pytorch/explicit, tensorflow/explicit):
        # prefix the framework; otherwise number the repeats.
        names = [run.label for run in runs]
        frameworks = [run.manifest.framework for run in runs]
        for run, framework in zip(runs, frameworks, strict=True):
            same = [f for name, f in zip(names, frameworks, strict=True) if name == run.label]
            if len(same) > 1 and framework and len(set(same)) > 1:
                run.label = f"{framework}/{run.label}"
        seen: dict[str, int] = {}
        for run in runs:
            count = seen.get(run.label, 0)
            seen[run.label] = count + 1
            if count:
                run.label = f"{run.label} #{count + 1}"
        for run, label in zip(runs, labels or [], strict=False):
            run.label = label
        yield runs
