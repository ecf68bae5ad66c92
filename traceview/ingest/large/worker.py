"""The worker process of a large trace's ingest (``traceview.ingest.large``), on a core the
ingest leaves free (the ranks are ingested one after the other):

    python -m traceview.ingest.large.worker read-part PARSER TRACE BOUNDARY RULES.pickle OUT PRELOAD IN_FD OUT_FD PARENT
    python -m traceview.ingest.large.worker analyse IN_FD OUT_FD PARENT

``read-part`` reads the later part of a plain trace read in two parts at once, leaves its
rows, survey and the parser's part in OUT (``spill.read_later_part``), says so on OUT_FD and
imports the PRELOAD modules (comma-separated: those of the analysis it will serve, named by
the ingest); it then routes those rows to their chunks when asked (``route.route_later_part``,
beside the ingest routing its own), and serves the analysis as ``analyse`` does. ``analyse``
runs the rank's analysis beside the normalizing (``sinks.InWorker`` is its other end): the
sink comes pickled in a file named on IN_FD (its pipe closed instead: there is nothing to
analyse, and the worker ends), then each chunk (an Arrow file and the rows' roles), and each
is answered on OUT_FD. A worker ends with the process that started it (PARENT; Linux). Any failure is its
exit status or its answer, and the ingest then does the work itself.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

from traceview.ingest.lifetime import die_with_parent


def main(argv: list[str]) -> int:
    die_with_parent(int(argv[-1]))
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())  # as the ingest's own process
    from traceview.ingest.large import trim

    trim.TRIM_SLACK = trim.HELPER_TRIM_SLACK
    if argv[0] not in ("read-part", "analyse"):
        print(f"traceview.ingest.large.worker: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    inbox = Connection(int(argv[-3]), writable=False)
    outbox = Connection(int(argv[-2]), readable=False)
    if argv[0] == "read-part":
        from traceview.ingest.large.spill import read_later_part
        from traceview.parsers import SplittableParser, parser_named

        name, path, boundary, rules_file, out, preload = argv[1:7]
        with Path(rules_file).open("rb") as fh:
            rules = pickle.load(fh)
        parser = cast(SplittableParser, parser_named(name))  # (the parent split with it)
        read_later_part(parser, Path(path), int(boundary), rules, Path(out))
        outbox.send(("part",))
        for module in filter(None, preload.split(",")):  # (imported while the ingest plans)
            importlib.import_module(module)
    analyse(inbox, outbox)
    return 0


def analyse(inbox: Connection, outbox: Connection) -> None:
    """Serve one rank's chunked analysis: ("chunk", arrow file, lo, hi) is added (the file holds
    the rows and, as columns _own and _counted, their roles)
    and answered ("ack",) or ("error", exception); ("finish", folder) writes the result tables
    there and answers ("done", {name: file}) (a table spilled as it was made: its
    ``SpilledTable``; None: analyse the rank whole) or the error."""
    import pyarrow as pa

    from traceview.ingest.large.route import route_later_part
    from traceview.ingest.large.trim import release_memory
    from traceview.model.columns import SpilledTable
    from traceview.store import rundir as R

    try:
        sink = inbox.recv()
        while isinstance(sink, tuple) and sink[0] == "route":  # the later part's rows first
            R.fault_point("helper:route")  # the tests kill the helper here, for real
            route_later_part(Path(sink[1]))
            outbox.send(("routed",))
            sink = inbox.recv()
    except EOFError:  # nothing to analyse here after all
        return
    pickled = Path(sink[1])  # ("sink", its pickle: sinks.InWorker)
    with pickled.open("rb") as source:
        sink = pickle.load(source)
    pickled.unlink(missing_ok=True)
    error: BaseException | None = None
    while True:
        message = inbox.recv()
        if message[0] == "chunk":
            _, path, lo, hi = message
            if error is None:
                try:
                    R.fault_point("helper:analyse")  # the tests kill the helper here, for real
                    # (read, not mapped: the columns the analysis drops are freed)
                    with pa.OSFile(path) as source:
                        events = pa.ipc.open_file(source).read_all()
                    own = events.column("_own").to_numpy(zero_copy_only=False)
                    counted = events.column("_counted").to_numpy(zero_copy_only=False)
                    events = events.drop_columns(["_own", "_counted"])
                    sink.add(events, own, counted, lo, hi)
                except Exception as exc:  # handed to the ingest, which raises it
                    error = exc
            Path(path).unlink(missing_ok=True)
            events = None  # (freed before the next chunk is read)
            release_memory()
            outbox.send(("ack",) if error is None else ("error", _sendable(error)))
        elif message[0] == "finish":
            result: dict[str, Any] | None = None
            if error is None:
                try:
                    release_memory(now=True)  # (before the combining, the end's peak)
                    tables = sink.finish()
                    if tables is not None:
                        result = {}
                        for name, table in tables.items():
                            if isinstance(table, SpilledTable):  # (written already: its name)
                                result[name] = table
                                continue
                            file = Path(message[1]) / f"result-{name}.arrows"
                            with (
                                pa.OSFile(str(file), "wb") as out,
                                pa.ipc.new_file(out, table.schema) as writer,
                            ):
                                writer.write_table(table)
                            result[name] = str(file)
                except Exception as exc:
                    error = exc
            outbox.send(("done", result) if error is None else ("error", _sendable(error)))
            return


def _sendable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    # no interpreter teardown (0.1-0.2 s of freeing what the analysis held): everything is
    # written, and the ingest waits for this process to end
    os._exit(code)
