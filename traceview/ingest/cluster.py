"""Ingest on a Dask distributed cluster: each rank's parse, normalize and analysis is one task.

The cluster is whatever the user already runs (``dask scheduler`` / ``dask worker``, a Slurm or
Kubernetes deployment); traceview only connects to its scheduler. A task writes its rank's events
into the staging run directory itself (a file system every worker reaches, as with ``collect``)
and returns the rank's small part (manifest entry, analysis tables, notes), so the client's memory
does not grow with the number of events. A worker that dies mid-task has its rank rescheduled by
Dask; every file a task writes goes to a temporary name first, so a killed attempt leaves nothing
that reads as valid. Dask is imported only here, and only when a scheduler is named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceview.model.errors import BadInput, UsageError

if TYPE_CHECKING:
    from traceview.ingest.discover import TraceFile
    from traceview.ingest.rank import RankAnalysis, RankPartial

#: The environment variable that names a scheduler when --scheduler is not given.
SCHEDULER_ENV = "TRACEVIEW_SCHEDULER"
#: How long to try reaching the scheduler before saying it is unreachable.
CONNECT_TIMEOUT_S = 10


def scheduler_from(address: str | None, scheduler_file: Path | None) -> str | Path | None:
    """The scheduler the user named: --scheduler, --scheduler-file, else $TRACEVIEW_SCHEDULER
    (an address, or a path to a scheduler file); None for local processes."""
    if address and scheduler_file:
        raise UsageError("give --scheduler or --scheduler-file, not both")
    if scheduler_file is not None:
        return scheduler_file
    named = address or os.environ.get(SCHEDULER_ENV) or None
    if named and "://" not in named and Path(named).is_file():
        return Path(named)
    return named


def _client(scheduler: str | Path) -> Any:
    try:
        from distributed import Client
    except ImportError:
        raise UsageError(
            "ingesting on a Dask cluster needs Dask: pip install 'traceview[dask]'"
        ) from None
    address = _address_in(scheduler) if isinstance(scheduler, Path) else scheduler
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        which = f"scheduler file {scheduler}" if isinstance(scheduler, Path) else scheduler
        raise BadInput(
            f"cannot reach the Dask scheduler at {which} within {CONNECT_TIMEOUT_S} s ({exc})"
        ) from None


def _address_in(scheduler_file: Path) -> str:
    """The address a scheduler file gives (Dask's own reader waits for a missing file forever)."""
    try:
        address = json.loads(scheduler_file.read_bytes()).get("address")
    except FileNotFoundError:
        raise UsageError(f"{scheduler_file}: no such scheduler file") from None
    except (OSError, ValueError, AttributeError, RecursionError) as exc:
        raise BadInput(f"{scheduler_file}: not a Dask scheduler file ({exc})") from None
    if not isinstance(address, str) or not address:
        raise BadInput(f"{scheduler_file}: not a Dask scheduler file (no address)")
    return address


def ingest_rank_task(
    trace: TraceFile,
    run: Path,
    run_id: str,
    rules_path: Path | None,
    analyze: RankAnalysis | None,
) -> RankPartial:
    """``ingest.ingest_rank`` on a worker, which it records in the rank's manifest entry."""
    from distributed import get_worker

    from traceview.ingest.rank import ingest_rank

    part = ingest_rank(trace, run, run_id, rules_path, analyze)
    part.info.worker = get_worker().address
    return part


def run_on_cluster(
    scheduler: str | Path,
    traces: list[TraceFile],
    staged: Path,
    run_id: str,
    rules_path: Path | None,
    analyze: RankAnalysis | None,
) -> Iterator[tuple[TraceFile, Callable[[], RankPartial]]]:
    """Each trace with a callable giving its rank's part (or raising what the task raised),
    as the cluster finishes them."""
    from distributed import as_completed

    client = _client(scheduler)
    try:
        futures = {
            client.submit(
                ingest_rank_task,
                trace,
                staged,
                run_id,
                rules_path,
                analyze,
                key=f"traceview-ingest-{run_id}-rank-{trace.rank}",
                pure=False,
            ): trace
            for trace in sorted(traces, key=lambda t: -t.size)  # large first: short tail
        }
        with client.as_current():  # as_completed finds its client as the current one
            # The parts of every rank finished since the last look are fetched in one gather:
            # fetched one future.result() round trip at a time, they were the ingest's serial
            # part on a many-core cluster. (as_completed's with_results fetches in the
            # background instead, and an interrupted ingest then logs a traceback per rank.)
            for batch in as_completed(futures).batches():
                # (errors skipped: a rank whose result was lost with its worker and whose
                # rerun failed is left to ``_result_of``, the batch's others are kept)
                done = dict(enumerate(f for f in batch if f.status == "finished"))
                fetched = client.gather(done, errors="skip") if done else {}
                parts = {done[i]: part for i, part in fetched.items()}
                done.clear()
                while batch:
                    # let go of each as it is taken: a worker keeps a result while the client
                    # holds its future (its peak grew with the ranks it ingested: 311 MB at
                    # 128 real-sized ranks, 438 MB at 512)
                    future = batch.pop()
                    trace = futures.pop(future)
                    yield trace, _result_of(future, trace, parts.pop(future, None))
    finally:
        client.close()


def _result_of(
    future: Any, trace: TraceFile, fetched: RankPartial | None
) -> Callable[[], RankPartial]:
    def result() -> RankPartial:
        from distributed.scheduler import KilledWorker

        if fetched is not None:
            return fetched
        try:
            part: RankPartial = future.result()  # raises what the task raised, or cancelled
        except KilledWorker:
            raise BadInput(
                f"{trace.path}: every Dask worker that took this rank died (out of memory?)"
            ) from None
        return part

    return result


def remove_attempt_leftovers(staged: Path) -> None:
    """Temporary files of attempts killed mid-write (they never read as valid: hidden names
    ending .tmp); the finished run should not carry them."""
    for leftover in staged.rglob(".*.tmp"):
        leftover.unlink(missing_ok=True)
