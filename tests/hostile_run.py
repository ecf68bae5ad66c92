"""The hostile-input corpus (issue 14), run through the real CLI: the machinery its tests share
(tests/integration/test_hostile.py, tests/fuzz/test_hostile.py, tests/unit/test_hostile.py).

Every case (``tests/hostile_corpus.py``) builds hostile inputs from the samples and runs
``report``, ``report --json``, ``ingest -o`` (and, on some, ``export``, ``compare``,
``scaling``) as a user's shell would, one child process each. Every run must end with:

- exit code 0 or 2 (a SIGKILL the case sends itself aside), no "internal error", no "Traceback";
- at most (input files + 4) lines on stderr, and no Python warning (``...Warning: ``) there;
- no hang: the case's timeout (120 s of wall time unless it says otherwise: generous, as the
  machine may be loaded);
- peak memory (the child's own max RSS, from ``os.wait4``) at most ``MEMORY_BOUND``;
- no raw control character in stdout or stderr (C0 and C1 but \\n and \\t, DEL, bidi
  overrides), no rich markup from the input interpreted, and ``--json`` output that parses;
- no previous run lost: a run directory the case names must still read afterwards, and a
  user's file that ``-o`` named must be unchanged;
- where the case says so: nothing written into the folders it names (``Plan.frozen``), no file
  a hostile input's code would make (``Plan.absent``), with programs that change its inputs
  running beside the commands (``Plan.background``).

Tiers: ``test_hostile_fast`` (a fixed sample, in the normal test command) and
``test_hostile_full`` (tests/fuzz, marked ``fuzz``, not collected by default: ``python -m pytest
-m fuzz tests/fuzz/test_hostile.py``). Cases run two at a time (a session-wide pool), results are checked
in each case's own test, so ``-k CASE_ID`` reruns one case alone. With ``HOSTILE_LOG=FILE``,
every case's runs (argv, exit code, peak RSS, seconds, problems) are appended to FILE as JSON
lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import hostile_corpus as H

# Peak RSS a run may reach. Measured here (/usr/bin/time, max RSS): `python -m traceview report`
# on sample_traces/pytorch/slowio/rank-0 peaks at 182 MB, on the largest samples
# (pytorch/gpu_ddp_nccl, tensorflow/slowio) at 218 and 225 MB; the heaviest honest case of the
# corpus (a 16 MB event name) at 411 MB. 1 GiB is over 4x a sample's peak and 2.5x that case,
# and far below what a reader reaches that follows what a file claims (the bombs pass 2 GB).
MEMORY_BOUND = 1024 * 1024 * 1024
# A child past this is killed at once (the machine is shared): it has failed the bound anyway.
MEMORY_KILL = 2 * MEMORY_BOUND
EXTRA_STDERR_LINES = 4
PARALLEL = int(os.environ.get("HOSTILE_PARALLEL", "2"))  # cases at a time

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_KILL_AT_RENAME = """\
import os, runpy, signal, sys
n = int(sys.argv[1]); sys.argv = ["traceview", *sys.argv[2:]]
main, calls = os.getpid(), [0]
def counted(f):
    def call(*a, **k):
        if os.getpid() == main:
            calls[0] += 1
            if calls[0] == n:
                os.kill(main, signal.SIGKILL)
        return f(*a, **k)
    return call
os.replace, os.rename = counted(os.replace), counted(os.rename)
runpy.run_module("traceview", run_name="__main__", alter_sys=True)
"""


# --- known failure classes ---------------------------------------------------------------------
#
# Each row: the class (exception and innermost traceview frame, found by rerunning one case with
# TRACEVIEW_DEBUG=1; `python -m tests.hostile_classify LOG` does it for a HOSTILE_LOG), the cases
# it covers (a regex on case ids), the signature every problem of such a case must match, and an
# example (always in the fast tier). Its cases are xfail(strict=True): a fix makes them XPASS and
# the row must go; a case that fails another way than its class says fails outright.
# History: the first full tier (main at c3e5bf6: 627 cases, 1,822 runs) found 91 failing cases
# in 23 classes; all were fixed the same day, and the 91 cases pass (run with -m fuzz on them).


@dataclass(frozen=True)
class Known:
    cls: str
    ids: str  # regex, matched (re.fullmatch) against case ids
    sig: str  # regex every problem of such a case must match (re.search)
    example: str  # one case id of the class (always in the fast tier)


_EXIT1 = r"exit code 1$"


def _internal(exc: str) -> str:
    return rf"{_EXIT1}|internal error: {exc}"


KNOWN: list[Known] = [
    # Empty: the 23 classes the full tier found on main at c3e5bf6 (wide ints, deep nesting,
    # gzip and world-size bombs, wrong-typed status and header fields, far-out times, C1/bidi
    # characters in --json, garbage run directories, faulty output locations, a kill between
    # two renames) were fixed in the session that added this corpus; one example of each stays
    # in the fast tier (FAST_FIXED). A class found later goes here, with its example.
]


def known_for(case_id: str) -> list[Known]:
    return [k for k in KNOWN if re.fullmatch(k.ids, case_id)]


class KnownFailure(AssertionError):
    """A case failed the way its known failure class says."""


# --- running a child ---------------------------------------------------------------------------


@dataclass
class Outcome:
    argv: list[str]
    code: int
    out: str
    err: str
    maxrss: int  # bytes
    seconds: float
    killed: str | None = None  # why the harness killed it
    problems: list[str] = field(default_factory=list)


# The children are started by a small launcher process (one per pool thread), not by pytest:
# on Linux a forked child's max RSS starts at its parent's RSS at the fork, so a child of the
# test process (over 200 MB) would never report less. The launcher forks, execs, waits with
# os.wait4 (the child's own rusage), and kills a child past its time or MEMORY_KILL.
_LAUNCHER = """\
import json, os, resource, signal, sys, time
def rss(pid):
    try:
        with open("/proc/%d/statm" % pid) as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0
for line in sys.stdin:
    job = json.loads(line)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(job["cwd"])
            fd_in = os.open(os.devnull, os.O_RDONLY)
            fd_out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fd_err = os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd_in, 0); os.dup2(fd_out, 1); os.dup2(fd_err, 2)
            if job["fsize"] is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize"], job["fsize"]))
            if job["vsize"] is not None:
                resource.setrlimit(resource.RLIMIT_AS, (job["vsize"], job["vsize"]))
            os.execve(job["cmd"][0], job["cmd"], job["env"])
        finally:
            os._exit(127)
    killed = None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        elapsed = time.monotonic() - start
        if killed is None:
            size = rss(pid)
            if size > job["mem_kill"]:
                killed = "memory: RSS %d MB passed %d MB, killed" % (size >> 20, job["mem_kill"] >> 20)
            elif elapsed > job["timeout"]:
                cpu = sum(int(x) for x in open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[11:13])
                killed = "hang: still running after %d s (%.0f s of CPU), killed" % (
                    job["timeout"], cpu / os.sysconf("SC_CLK_TCK"))
            elif job["kill_after"] is not None and elapsed > job["kill_after"]:
                killed = "sigkill (the case's own)"
            if killed:
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status), "maxrss": usage.ru_maxrss * 1024,
                      "seconds": round(time.monotonic() - start, 2), "killed": killed}), flush=True)
"""
_launchers = threading.local()


def _launcher() -> subprocess.Popen[str]:
    proc = getattr(_launchers, "proc", None)
    if proc is None or proc.poll() is not None:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _LAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _launchers.proc = proc
    return proc


def execute(run: H.Run, cwd: Path, timeout: float) -> Outcome:
    """Run ``python -m traceview ARGV`` in ``cwd`` and its contract's facts."""
    if run.kill_at_rename is not None:
        cmd = [sys.executable, "-c", _KILL_AT_RENAME, str(run.kill_at_rename), *run.argv]
    else:
        cmd = [sys.executable, "-m", "traceview", *run.argv]
    if run.as_nobody:  # root ignores a folder's mode; nobody does not
        cmd = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    env = {**os.environ, "COLUMNS": "120", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("TRACEVIEW_DEBUG", None)
    tag = threading.get_ident()
    out_path, err_path = cwd / f".out-{tag}", cwd / f".err-{tag}"
    job = {
        "cmd": cmd,
        "cwd": str(cwd),
        "env": env,
        "out": str(out_path),
        "err": str(err_path),
        "fsize": run.fsize,
        "vsize": run.vsize,
        "timeout": timeout,
        "kill_after": run.kill_after,
        "mem_kill": MEMORY_KILL,
    }
    launcher = _launcher()
    assert launcher.stdin is not None and launcher.stdout is not None
    launcher.stdin.write(json.dumps(job) + "\n")
    launcher.stdin.flush()
    facts = json.loads(launcher.stdout.readline())
    outcome = Outcome(
        argv=run.argv,
        code=facts["code"],
        out=out_path.read_bytes().decode("utf-8", "replace"),
        err=err_path.read_bytes().decode("utf-8", "replace"),
        maxrss=facts["maxrss"],
        seconds=facts["seconds"],
        killed=facts["killed"],
    )
    out_path.unlink()
    err_path.unlink()
    return outcome


def problems_of(o: Outcome, run: H.Run, inputs: int) -> list[str]:
    p: list[str] = []
    own_kill = o.killed == "sigkill (the case's own)" or (
        run.kill_at_rename is not None and o.code == -signal.SIGKILL
    )
    if o.killed and not own_kill:
        p.append(o.killed)
    elif not own_kill and o.code not in (0, 2):
        p.append(f"exit code {o.code}")
    if run.must_fail and o.code == 0:
        p.append("exit 0 where the command cannot have done its work")
    if "internal error" in o.err:
        p.append("internal error: " + _line(o.err, "internal error"))
    if "Traceback" in o.err:
        p.append("Traceback: " + o.err.strip().splitlines()[-1][:200])
    if m := re.search(r"\w+Warning: .*", o.err):  # numpy's, Python's: not a message to a user
        p.append(f"Python warning on stderr: {m.group()[:160]}")
    lines = len(o.err.splitlines())
    if lines > inputs + EXTRA_STDERR_LINES:
        p.append(f"{lines} stderr lines for {inputs} input file(s)")
    if o.maxrss > MEMORY_BOUND:
        p.append(f"memory: peak RSS {o.maxrss / 2**20:.0f} MB over {MEMORY_BOUND / 2**20:.0f} MB")
    for name, text in (("stdout", o.out), ("stderr", o.err)):
        if m := _CONTROL.search(text):
            p.append(f"control character {m.group()!r} on {name}")
        if "MARKUP" in text and "[bold red]" not in text:
            p.append(f"rich markup from the input interpreted on {name}")
    if "--json" in o.argv and o.code == 0:
        try:
            json.loads(o.out)
        except ValueError as exc:
            p.append(f"--json output does not parse ({exc})")
    if "--html" in o.argv and o.code == 0:
        p += page_problems(Path(o.argv[o.argv.index("--html") + 1]))
    return p


def page_problems(page: Path) -> list[str]:
    """What an HTML page written from hostile input must never hold: markup from the input (a
    second script, an element made from a name), a reference outside the page, a raw control
    character."""
    try:
        text = page.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return [f"--html: the page cannot be read back ({exc})"]
    p = []
    if text.count("<script") != 1:
        p.append(f"--html: {text.count('<script')} script elements (the page has one)")
    if m := _CONTROL.search(text):
        p.append(f"--html: control character {m.group()!r} in the page")
    if re.search(r"<(img|iframe|object|embed|form|input|foreignObject|math)\b", text, re.I):
        p.append("--html: an element from the input in the page")
    # (the page's own: one style element, its SVG drawings closed as opened, no comment; its
    # elements, attributes and links as a browser parses them: a name that ends an element or
    # opens one breaks these, a name escaped does not)
    if text.count("<style") != 1 or text.count("</style>") != 1:
        p.append("--html: a style element from the input in the page")
    if text.count("<svg") != text.count("</svg>"):
        p.append(f"--html: {text.count('<svg')} svg elements opened, {text.count('</svg>')} closed")
    if m := re.search(r"<!--|<!\[CDATA\[", text, re.I):
        p.append(f"--html: markup from the input in the page: {m.group()[:60]!r}")
    p += [f"--html: {x}" for x in _foreign_markup(text)]
    return p


#: The elements the page is made of (views/html), and the attributes no page of it has
_PAGE_TAGS = frozenset((
    "a", "b", "body", "br", "caption", "circle", "code", "details", "div", "g", "h1", "h2", "h3",
    "head", "header", "html", "i", "li", "line", "main", "meta", "nav", "p", "path", "polyline",
    "rect", "script", "section", "small", "span", "style", "summary", "svg", "table", "tbody",
    "td", "text", "th", "thead", "title", "tr", "ul",
))  # fmt: skip
_NEVER_ATTRS = re.compile(r"on.*|src|srcset|srcdoc|formaction|action|xlink:href|style", re.I)


def _foreign_markup(text: str) -> list[str]:
    """Elements and attributes of ``text`` (an HTML page, parsed as a browser would tokenize
    it) the page's own code never writes: made from the input; and a reference out of the
    page (an ``href`` not to one of its own ``#`` places). Text that only reads as markup (a
    name, escaped) is none of these."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag not in _PAGE_TAGS:
                found.append(f"a <{tag[:20]}> element from the input")
            found.extend(
                f"a {k[:20]}= attribute from the input"
                for k, _ in attrs
                if _NEVER_ATTRS.fullmatch(k)
            )
            found.extend(
                f"a reference outside the page: {(v or '')[:80]!r}"
                for k, v in attrs
                if k == "href" and not (v or "").startswith("#")
            )

    Tags().feed(text)
    return list(dict.fromkeys(found))[:5]


def _line(text: str, needle: str) -> str:
    return next((line for line in text.splitlines() if needle in line), "")[:300]


# --- the session's pool ------------------------------------------------------------------------


@dataclass
class CaseResult:
    outcomes: list[Outcome]
    problems: list[str]
    seconds: float


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` (relative): its size and modification time (links not
    followed; a folder that cannot be read holds nothing)."""
    found: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            size = info.st_size if not os.path.isdir(path) or os.path.islink(path) else 0
            found[os.path.relpath(path, folder)] = (size, info.st_mtime_ns)
    return found


def _background(program: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", program],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def run_case(case: H.Case, folder: Path) -> CaseResult:
    start = time.monotonic()
    plan = H.build(case, folder)
    outcomes, problems = [], []
    before = {path: tree(path) for path in plan.frozen}
    helpers = [_background(program, folder) for program in plan.background]
    try:
        for run in plan.runs:
            o = execute(run, folder, case.timeout)
            o.problems = problems_of(o, run, plan.inputs)
            outcomes.append(o)
            problems += [
                f"`{' '.join(run.argv[:1])}`{' --json' if '--json' in run.argv else ''}: {x}"
                for x in o.problems
            ]
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait()
    for path in plan.absent:
        if os.path.lexists(path):
            problems.append(f"ran: {path.name} exists (a hostile input's code ran)")
    for path, allowed in plan.frozen.items():
        after = tree(path)
        changed = sorted(
            rel
            for rel in set(before[path]) | set(after)
            if before[path].get(rel) != after.get(rel) and not re.fullmatch(allowed, rel)
        )
        if changed:
            problems.append(f"written into {path.name}: {', '.join(changed[:5])}")
    for path, data in plan.keep.items():
        if not path.is_file() or path.read_bytes() != data:
            problems.append(f"data loss: the user's {path.name} was changed or removed")
    for run_dir in plan.survive:
        if not (run_dir / "manifest.json").is_file():
            left = sorted(p.name for p in run_dir.parent.iterdir() if run_dir.name in p.name)
            problems.append(f"data loss: previous run lost (left: {', '.join(left) or 'nothing'})")
            continue
        o = execute(H.Run(["report", "--json", str(run_dir)]), folder, case.timeout)
        o.problems = problems_of(o, H.Run([]), 6)
        outcomes.append(o)
        if o.code != 0:
            problems.append(
                f"data loss: the previous run no longer reads ({_line(o.err, 'error')})"
            )
        problems += [f"`report` of the run afterwards: {x}" for x in o.problems]
    return CaseResult(outcomes, problems, round(time.monotonic() - start, 2))


class Pool:
    """Runs the selected cases two at a time, in collection order, from the first test on."""

    def __init__(self, cases: list[H.Case], root: Path) -> None:
        self.executor = ThreadPoolExecutor(PARALLEL)
        self.futures: dict[str, Future[CaseResult]] = {}
        for case in cases:
            if case.id not in self.futures:
                self.futures[case.id] = self.executor.submit(run_case, case, root / case.id)
        self.log = os.environ.get("HOSTILE_LOG")

    def result(self, case: H.Case) -> CaseResult:
        result = self.futures[case.id].result()
        if self.log:
            record = {
                "id": case.id,
                "problems": result.problems,
                "seconds": result.seconds,
                "runs": [
                    {
                        "argv": o.argv,
                        "code": o.code,
                        "maxrss_mb": round(o.maxrss / 2**20, 1),
                        "seconds": o.seconds,
                        "err": o.err[-600:],
                    }
                    for o in result.outcomes
                ],
            }
            with open(self.log, "a") as f:
                f.write(json.dumps(record) + "\n")
        return result


# --- the tiers ---------------------------------------------------------------------------------

CASES = H.all_cases()
BY_ID = {c.id: c for c in CASES}

# The fast tier: one case or a few of every family and format, and every known class's example.
FAST = [
    "kineto-truncate-gz-0.37",
    "kineto-bitflip-gz-1",
    "kineto-type-ts-str-one",
    "kineto-escape-csi-every-string",
    "kineto-escape-markup-names",
    "mxnet-truncate-gz-0.37",
    "mxnet-escape-osc-every-string",
    "tf1-truncate-0.37",
    "xplane-truncate-0.37",
    "xplane-escape-csi-every-string",
    "folder-good-plus-empty",
    "folder-missing-ranks",
    "folder-good-plus-escape-filename",
    "status-escape-csi-every-string",
    "rundir-good",
    "rundir-manifest-garbage",
    "rundir-manifest-escape-csi-every-string",
    "kill-reingest-after-700ms",
    "flight-pickle-reduce-system-p2",
    "html-kineto-names",
]

#: One case of each class the full tier found, and that was fixed: kept as regression tests.
FAST_FIXED = [
    "kineto-wideint-args",
    "kineto-wideint-step-number",
    "mxnet-wideint-step-number",
    "mxnet-step-number-digits-5000",
    "kineto-deep-args",
    "tf1-wideint-tid",
    "kineto-header-rank-wide",
    "kineto-header-world_size-1e10",
    "kineto-header-basetime-wide",
    "kineto-header-basetime-str",
    "kineto-bomb-spaces",
    "status-clock-offset-wide",
    "kineto-escape-c1-every-string",
    "rundir-manifest-nonutf8",
    "rundir-steps-wrong-shape",
    "rundir-events-dir-abc",
    "output-o-regular-file",
    "output-readonly-folder",
    "output-o-name-too-long",
    "output-fsize-4096-ingest",
    "output-o-name-escape",
    "kill-reingest-rename-9-j1",
    "kineto-dur-1e18-all",
    "kineto-one-event-50k",
    "record-steps-span-u32",
    "request-folder-links-outside",
]


def _param(case: H.Case) -> object:
    marks = []
    if case.needs is not None and not case.needs.exists():
        marks.append(pytest.mark.skip(reason=f"needs {case.needs}"))
    if known := known_for(case.id):
        marks.append(
            pytest.mark.xfail(
                strict=True, raises=KnownFailure, reason="; ".join(k.cls for k in known)
            )
        )
    return pytest.param(case, id=case.id, marks=marks)


def _fast_ids() -> list[str]:
    ids = list(dict.fromkeys([*FAST, *FAST_FIXED, *(k.example for k in KNOWN)]))
    missing = [i for i in ids if i not in BY_ID]
    assert not missing, f"fast-tier ids that are not cases: {missing}"
    return ids


def check(case: H.Case, result: CaseResult) -> None:
    if not result.problems:
        return
    text = (
        f"{case.id}: "
        + "; ".join(result.problems)
        + f"\n  rebuild: python -m tests.hostile_corpus {case.id}"
    )
    known = known_for(case.id)
    if known and all(any(re.search(k.sig, p) for k in known) for p in result.problems):
        raise KnownFailure(text)
    raise AssertionError(text)
