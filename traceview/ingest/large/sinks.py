"""The per-rank analysis fed each chunk beside the normalization: on a thread of its own, in a
worker process on the core the ingest leaves free (``worker``), or split between the two.
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from traceview.ingest.large.trim import release_memory
from traceview.model.columns import SpilledTable
from traceview.parsers import ParsedTrace


class ChunkSink(Protocol):
    """Takes each chunk as it is normalized (the per-rank analysis, ``analysis.parts``): its
    rows (``own``: the chunk's, the others context carried in), those it writes (``counted``),
    and the time span [lo, hi) whose step markers it holds; ``finish``: its result."""

    def add(
        self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int
    ) -> None: ...

    def finish(self) -> dict[str, pa.Table | SpilledTable] | None: ...


#: A rank's side inputs by name (schema.SIDE_INPUTS, each as its ``stored`` schema: the rank's
#: rows on the run's clock); an input the run has no file for is absent.
SideTables = Mapping[str, pa.Table]

#: A per-rank analysis: one rank's events and side inputs in, named result tables out (written
#: as NAME.parquet). It must be a module-level function or object: worker processes receive it
#: by reference.
RankAnalysis = Callable[[pa.Table, SideTables], dict[str, pa.Table]]

#: What the chunked analysis of a rank is made from: the training thread, whether the rank has
#: device activities, whether another thread runs backward, and its one window (no markers).
SinkMaker = Callable[[tuple[int, int], bool, bool, tuple[int, int] | None], ChunkSink]


@runtime_checkable
class RankAnalysisInChunks(Protocol):
    """A per-rank analysis that also takes a rank a chunk at a time, as it is normalized or
    read back (``analysis.rank_tables``): ``chunked(side, spill)`` makes, from what the whole
    rank holds, the sink each chunk goes to (``spill``: where it may write its segments as it
    makes them); ``modules``: what a process that runs it imports ahead. Ingest asks for
    nothing else of an analysis; one that is a plain function is fed the whole rank."""

    modules: tuple[str, ...]

    def __call__(self, events: pa.Table, side: SideTables) -> dict[str, pa.Table]: ...

    def chunked(self, side: SideTables, spill: Path | None = None) -> SinkMaker: ...


#: Makes the sink of a rank from what the first pass found: the parser's result (without
#: events), the training thread, whether the rank has device activities, whether a thread
#: other than the training thread runs backward operators, and (a rank without step markers)
#: its one window.
SinkFactory = Callable[
    [ParsedTrace, tuple[int, int], bool, bool, tuple[int, int] | None], ChunkSink | None
]


class InThread:
    """A sink fed on a thread of its own: the analysis of chunk k (numpy and Arrow, which let
    go of the GIL) runs while chunk k+1 is normalized, and its end (``close``) while the events
    file is finished. One chunk at most waits for it (the memory of a chunk's rows)."""

    def __init__(self, sink: ChunkSink):
        self.sink = sink
        self.waiting: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.result: dict[str, pa.Table | SpilledTable] | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._work, name="traceview-analysis", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            while (item := self.waiting.get()) is not None:
                if self.error is None:
                    self.sink.add(*item)
            if self.error is None:
                self.result = self.sink.finish()
        except BaseException as exc:  # handed to the caller by finish
            self.error = exc
            while self.waiting.get() is not None:  # let the producer go on to the end
                pass

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        if self.error is None:
            self.waiting.put((events, own, counted, lo, hi))

    def abandon(self) -> None:
        """The chunks stop coming (an error): the thread ends without finishing the sink."""
        self.error = self.error or RuntimeError("abandoned")
        self.close()

    def close(self) -> None:
        """No more chunks: the sink finishes on its thread."""
        if self.thread.is_alive() and not self.closed:
            self.closed = True
            self.waiting.put(None)

    def finish(self) -> dict[str, pa.Table | SpilledTable] | None:
        self.close()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def free_core() -> bool:
    """Whether a helper process may run beside the ingest (``first_pass``, ``InWorker``): a
    second core, and ``TRACEVIEW_HELPER_PROCESSES`` not 0."""
    if os.environ.get("TRACEVIEW_HELPER_PROCESSES", "1") == "0":
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) >= 2


class WorkerProcess:
    """A helper process (``traceview.ingest.large.worker``) with the two pipes of its analysis service:
    ``outbox`` to it, ``inbox`` from it. It ends with the ingest (Linux), or when ``close``
    closes its pipes."""

    def __init__(self, command: list[str], stderr: Path):
        from multiprocessing.connection import Connection

        to_helper, from_us = os.pipe()
        to_us, from_helper = os.pipe()
        try:
            with stderr.open("wb") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "traceview.ingest.large.worker", *command,
                     str(to_helper), str(from_helper), str(os.getpid())],
                    pass_fds=(to_helper, from_helper),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                )  # fmt: skip
        except OSError:
            for fd in (to_helper, from_us, to_us, from_helper):
                os.close(fd)
            raise
        os.close(to_helper)
        os.close(from_helper)
        self.outbox = Connection(from_us, readable=False)
        self.inbox = Connection(to_us, writable=False)

    def close(self, kill: bool = False) -> None:
        """Close the pipes (a helper waiting for work then ends) and wait for it to end."""
        for end in (self.outbox, self.inbox):
            end.close()
        if kill and self.proc.poll() is None:
            self.proc.kill()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class InWorker:
    """A sink run by a helper process (``traceview.ingest.large.worker analyse``) on the core the ingest
    leaves free: the analysis of chunk k runs while chunk k+1 is normalized, in parallel (a
    thread shares the interpreter). A chunk's rows go over in an Arrow file in the work
    folder; at most ``AHEAD`` chunks wait for it (files on disk: 4 rather than 2 left the
    ingest waiting 0.4 s less on a 1 GB trace). Where the helper dies, ``finish`` returns None
    (the rank is then analysed from its events file); its errors are raised there. ``helper``:
    one already running and waiting for the sink (the one that read the later part of the
    trace, its imports done); otherwise one is started."""

    AHEAD = 4

    def __init__(self, sink: ChunkSink, work: Path, helper: WorkerProcess | None = None):
        # its own folder: the work folder is gone when the ingest reads the result
        self.work = work.with_name(work.name + ".analysis")
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir()
        if helper is None:
            try:
                helper = WorkerProcess(["analyse"], self.work / "analysis.stderr")
            except OSError:  # no process can start (the caller runs the sink on a thread)
                shutil.rmtree(self.work, ignore_errors=True)
                raise
        self.helper = helper
        self.sent = self.answered = 0
        self.lost = False  # the helper died
        self.closed = False
        self.error: BaseException | None = None
        # the sink goes over in a file (its side inputs, memory records, can be tens of MB: a
        # pipe's message is pickled whole in memory, then read whole on the other side)
        path = self.work / "sink.pickle"
        try:
            with path.open("wb") as out:
                pickle.dump(sink, out, protocol=5)
        except OSError:  # (a full disk: the caller runs the sink on a thread)
            self._end(kill=True)
            raise
        self._send(("sink", str(path)))

    def _send(self, message: Any) -> None:
        if not self.lost:
            try:
                self.helper.outbox.send(message)
            except OSError:  # the helper died (a broken pipe)
                self.lost = True

    def _answer(self) -> tuple[Any, ...] | None:
        try:
            answer = self.helper.inbox.recv()
        except (EOFError, OSError):
            self.lost = True
            return None
        if answer[0] == "error" and self.error is None:
            self.error = answer[1]
        return answer

    def _answered_up_to(self, ahead: int) -> None:
        """Wait for the chunks' answers until at most ``ahead`` chunks are unanswered."""
        while not self.lost and self.sent - self.answered > ahead:
            self._answer()
            self.answered += 1

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        self._answered_up_to(self.AHEAD - 1)
        if self.lost or self.error is not None:
            return
        path = self.work / f"analysis-{self.sent}.arrows"
        # the rows' roles go in the file too: a message larger than the pipe's buffer would
        # wait for the helper to be done with the chunk before
        events = events.append_column("_own", pa.array(own)).append_column(
            "_counted", pa.array(counted)
        )
        with pa.OSFile(str(path), "wb") as out, pa.ipc.new_file(out, events.schema) as writer:
            writer.write_table(events)
        self._send(("chunk", str(path), lo, hi))
        self.sent += 1

    def close(self) -> None:
        """No more chunks: the helper finishes the sink (while the events file is finished)."""
        if not self.closed:
            self.closed = True
            self._send(("finish", str(self.work)))

    def abandon(self) -> None:
        self.closed = True
        self._end(kill=True)

    def finish(self) -> dict[str, pa.Table | SpilledTable] | None:
        self.close()
        self._answered_up_to(0)
        answer = None if self.lost else self._answer()
        try:
            if self.error is not None:
                raise self.error
            if answer is None or answer[1] is None:
                return None
            tables: dict[str, pa.Table | SpilledTable] = {}
            for name, file in answer[1].items():
                if isinstance(file, SpilledTable):  # (its rows stay in its file)
                    tables[name] = file
                    continue
                with pa.OSFile(file, "rb") as source:
                    tables[name] = pa.ipc.open_file(source).read_all()
            return tables
        finally:
            self._end()

    def _end(self, kill: bool = False) -> None:
        self.helper.close(kill)
        shutil.rmtree(self.work, ignore_errors=True)


def in_worker(
    sink: ChunkSink, work: Path, helper: WorkerProcess | None = None
) -> InWorker | HereAndThere:
    """``sink`` run by a helper process; where it splits (``ChunkedAnalysis.split``), its
    per-event part runs here, beside the normalization, and only the rest in the helper: the
    two cores then finish at about the same time."""
    split = getattr(sink, "split", None)
    if split is None:
        return InWorker(sink, work, helper)
    here, there = split()
    return HereAndThere(here, InWorker(there, work, helper))


class HereAndThere:
    """A sink in two parts: one fed in this process as each chunk comes, the other in a helper
    (``InWorker``); the result is both parts' tables (None where the helper's is)."""

    def __init__(self, here: ChunkSink, there: InWorker):
        self.here, self.there = here, there

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        self.there.add(events, own, counted, lo, hi)  # (first: the helper starts on it)
        self.here.add(events, own, counted, lo, hi)

    def close(self) -> None:
        self.there.close()

    def abandon(self) -> None:
        self.there.abandon()

    def finish(self) -> dict[str, pa.Table | SpilledTable] | None:
        self.there.close()  # (the helper finishes its part while this one is combined)
        release_memory(now=True)  # (before the combining, the end's peak)
        try:
            here = self.here.finish()
        except BaseException:
            self.there.abandon()
            raise
        tables = self.there.finish()
        return None if tables is None or here is None else {**tables, **here}


Background = InThread | InWorker | HereAndThere  # (a sink fed beside the ingest)
