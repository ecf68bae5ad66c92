"""The profile windows of a run `collect` made: window 0 is its own (RUN/raw), each window asked
of the running job with ``traceview profile`` is RUN/windows/K (a run directory of its own, its
traces in RUN/windows/K/raw, its step record RUN's), asked by RUN/requests/profile-K.json.

Here: listing them, asking for one (the only thing traceview writes into a running job's
directory, atomically), and choosing one for ``report``/``tui``/``export``/``compare``
(``--window K``; the newest complete one by default), ingested into its folder when first read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from traceview.collectors.rankside_record import open_regular
from traceview.model.errors import BadInput
from traceview.model.results.live import ProfileWindow, WindowState

if TYPE_CHECKING:
    from traceview.analysis.live import LiveInputs
from traceview.store import names as R

_REQUEST = re.compile(r"profile-(\d{1,6})\.json$")
_WINDOW = re.compile(r"(\d{1,6})$")
#: a window asked starts this long after the ask at least (seconds): every rank reads the ask
#: before its steps begin (ranks look for asks 4 times a second)
LEAD_S = 1.5
#: the frameworks whose ranks take a window asked of the job
ON_DEMAND = frozenset(("pytorch", "tensorflow", "jax"))
#: windows asked and not yet written, at most (a flood of asks is refused past it)
MAX_PENDING = 4


def window_path(run: Path, window: int) -> Path:
    return run if window == 0 else run / R.WINDOWS / str(window)


def _statuses(folder: Path) -> list[dict[str, Any]]:
    """The ranks' status.json under ``folder``/raw (those that read)."""
    found = []
    try:
        folders = list((folder / R.RAW).glob("rank-*"))
    except OSError:
        return []
    for rank_folder in folders:
        try:
            with open_regular(rank_folder / "status.json") as f:
                said = json.loads(f.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(said, dict):
            found.append(said)
    return found


def _requests(run: Path) -> dict[int, dict[str, Any]]:
    """The profile requests of ``run`` that read as the ranks read them, by window."""
    from traceview.collectors.rankside_record import read_request

    asked = {}
    try:
        names = os.listdir(run / R.REQUESTS)
    except OSError:
        return {}
    for name in names[: 10 * MAX_PENDING + 1000]:
        match = _REQUEST.fullmatch(name)
        said = read_request(run / R.REQUESTS / name) if match else None
        if match and said is not None and said["window"] == int(match[1]):
            asked[said["window"]] = said
    return asked


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def list_windows(
    run: Path, job_ended: bool = False, ranks: int | None = None
) -> list[ProfileWindow]:
    """Every window of ``run``, by number: its steps (the job's numbers of its recorded
    steps), and whether every rank (``ranks``: of the step record; else those that wrote
    one) wrote it."""
    found = []
    asked = _requests(run)
    numbers = {0, *asked}
    with contextlib.suppress(OSError):
        numbers |= {int(p.name) for p in (run / R.WINDOWS).iterdir() if _WINDOW.fullmatch(p.name)}
    for k in sorted(numbers):
        statuses = _statuses(window_path(run, k))
        if k == 0 and not statuses:
            continue
        written = [s for s in statuses if s.get("trace_files") and s.get("state") != "profiling"]
        firsts = [f for f in (_int(s.get("first_step")) for s in written) if f is not None]
        counts = [c for c in (_int(s.get("profiled_steps")) for s in written) if c is not None]
        request = asked.get(k, {})
        first = min(firsts) if firsts else _int(request.get("start_step"))
        began = [b for b in (_int(s.get("began_step")) for s in statuses) if b is not None]
        warmup = _int(request.get("warmup")) if k else _int(_live(run).get("warmup"))
        if not began and first is not None and warmup is not None:
            began = [first - warmup]
        steps = max(counts) if counts else _int(request.get("steps"))
        last = first + steps - 1 if first is not None and steps else None
        expected = ranks or len(statuses)
        state: WindowState
        if written and len(written) >= expected:
            state = "complete"
        elif statuses or written:
            state = "partial"
        else:
            state = "missed" if job_ended else "asked"
        found.append(
            ProfileWindow(
                window=k,
                first_step=first,
                last_step=last,
                state=state,
                ranks=len(written),
                began_step=min(began) if began else first,
            )
        )
    return found


def ask_window(run: Path, look: LiveInputs, steps: int, warmup: int | None) -> tuple[int, int, int]:
    """Ask every rank of the job running into ``run`` (``look``: a look at it, runs.live) to
    profile ``steps`` steps (after ``warmup``; None: collect's) at a step boundary:
    RUN/requests/profile-K.json, written atomically. Returns (K, its first recorded step, the
    ranks asked). BadInput where the job has ended, or too many windows are pending."""
    frameworks = {str(f) for f in (st.get("framework") for st in _statuses(run)) if f}
    if frameworks and not frameworks & ON_DEMAND:
        raise BadInput(
            f"{run}: profile on demand needs PyTorch, TensorFlow or JAX ranks; this job's are "
            f"{', '.join(sorted(frameworks))} (their step record is watched all the same)"
        )
    if look.job.ended or look.job.collect_alive is False:
        raise BadInput(f"{run}: the job has ended; profile asks a running job for steps")
    if look.ranks and all(r.end_state is not None for r in look.ranks):
        raise BadInput(
            f"{run}: every rank of the job has ended (each wrote its end); profile asks a "
            "running job for steps"
        )
    folder = run / R.REQUESTS
    if folder.is_symlink():  # (what a run holds is untrusted: nothing is written outside it)
        raise BadInput(
            f"{folder}: a link, not a folder of the run; profile writes only into the run"
        )
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"{folder}: not a folder; profile writes its request there")
    if not look.ranks:
        raise BadInput(
            f"{run}: no rank of the job has started its steps yet; ask again once it has"
        )
    said = _live(run)
    warmup = warmup if warmup is not None else _int(said.get("warmup"))
    warmup = 2 if warmup is None else warmup
    windows = list_windows(run, ranks=len(look.ranks))
    pending = [w for w in windows if w.window and w.state in ("asked", "partial")]
    if len(pending) >= MAX_PENDING:
        raise BadInput(
            f"{run}: {len(pending)} profile windows asked and not yet written "
            f"({', '.join(str(w.window) for w in pending)}); ask again once they are"
        )
    now = max(r.steps_done for r in look.ranks)
    step_ms = float(np.median(look.step_ms[-50:])) if len(look.step_ms) else 1000.0
    lead = int(np.ceil(LEAD_S * 1e3 / max(step_ms, 1e-3))) + 1
    busy = max((w.last_step or 0) for w in windows) + 1 if windows else 0
    start = max(now + lead + warmup, busy + warmup)
    number = max((w.window for w in windows), default=0) + 1
    request = {
        "window": number,
        "start_step": start,
        "steps": steps,
        "warmup": warmup,
        "asked_ns": time.time_ns(),
    }
    return _claim(folder, request), start, len(look.ranks)


def _claim(folder: Path, request: dict[str, Any]) -> int:
    """``request`` written whole as profile-K.json for the first K from its window that no
    request holds (linked from a temporary file: a request is never overwritten, two asks at
    once get two windows); K."""
    from traceview.store import rundir

    first = request["window"]
    mine = secrets.token_hex(8)  # (asks at once, threads of one process too: a file each)
    for number in range(first, first + 100):
        request["window"] = number
        tmp = folder / f".ask-{os.getpid()}-{mine}-{number}.json"
        rundir.write_json(tmp, request)
        try:
            os.link(tmp, folder / f"profile-{number}.json")
            return int(number)
        except FileExistsError:
            continue
        except OSError:  # (a file system without links: renamed, as any file of a run is)
            os.replace(tmp, folder / f"profile-{number}.json")
            return int(number)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    raise BadInput(f"{folder}: profile-{first}.json to profile-{first + 99}.json are taken")


def _live(run: Path) -> dict[str, Any]:
    try:
        with open_regular(run / R.LIVE) as f:
            said = json.loads(f.read(1 << 16))
    except (OSError, ValueError, RecursionError):
        return {}
    return said if isinstance(said, dict) else {}


def job_ended(run: Path) -> bool:
    """Whether the job collect ran into ``run`` has ended (its manifest, or live.json's exit
    code)."""
    try:
        if (run / R.MANIFEST).is_file():
            return True
        with open_regular(run / R.LIVE) as f:
            said = json.loads(f.read(1 << 16))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(said, dict) and "exit_code" in said


def collect_steps(run: Path) -> int:
    """The steps collect's first window recorded (its --steps; 5 where not said)."""
    steps = _int(_live(run).get("steps"))
    return steps if steps is not None and 1 <= steps <= 1000 else 5
