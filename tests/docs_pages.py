"""The commands the README, CONTRIBUTING.md and the documentation site (docs/) show, as a reader
would paste them; what the tests run and compare, and what they do not run, with why.

What is run (tests/live/test_readme.py): every line of every ```bash block, every example
output's `$ command` and every ```python block, page by page in page order, each page in one
scratch folder that holds links to the repository's `sample_traces/`, `examples/` and
`.venv-mxnet`, with this Python's environment first on PATH. Each must exit 0 without a
traceback. What is compared (tests/integration/test_docs_examples.py, no live job): every example
output, a fenced block whose first line is `$ command`, against what the command prints at 80
columns, line by line; a line `…` or `...` in the shown output stands for any number of lines
left out, trailing spaces do not count, and `  (then 2: ...)` after the command is prose.

What is changed, and why (the only changes):
- `PATH` and `TRACES...` stand for traces: `sample_traces/pytorch/ddp`. (`RUN` is left as
  written: the ingest line makes a run directory named RUN that the lines after it read.)
- As root, `mpirun` gets `--allow-run-as-root`, as the profiling page tells root users to add.
- MASTER_PORT is set to a free port, so that the example job does not collide with another
  job on the machine (examples/train.py's default is 29500).

What is not run is listed in SKIPPED with the reason (matched on the whole command, its comment
left out); a line listed there that no page shows any more fails tests/unit/test_readme.py.

``python -m tests.docs_pages --copy-screenshots`` copies the TUI snapshots the test suite makes
into docs/img/tui/ (tests/unit/test_docs_site.py fails while they differ).
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SNAPSHOTS = REPO / "tests" / "integration" / "__snapshots__" / "test_tui_snapshots"
SCREENSHOTS = DOCS / "img" / "tui"
COLUMNS = 80  # every example output is shown as printed at this width


def pages() -> list[Path]:
    """Every Markdown file a reader sees: the README, CONTRIBUTING.md and the site's pages."""
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]


_SETUP = "sets up the environment the test runs in; .ci/run does this from scratch in a clone"
_CLUSTER = (
    "needs a cluster at that address (and Slurm); test_cluster.py runs a real Dask cluster on "
    "127.0.0.1"
)
SKIPPED: dict[str, str] = {
    "python3 -m venv .venv && source .venv/bin/activate": _SETUP,
    "pip install -e .": _SETUP,
    "source .venv/bin/activate": _SETUP,
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": _SETUP,
    "pip install -c constraints/ci.txt torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": _SETUP,
    "pip install -c constraints/ci.txt tensorflow-cpu==2.21.0 -e '.[dev,mpi,bench,tensorflow,dask]'": _SETUP,
    "constraints/refresh.sh": "rebuilds every environment and runs the whole suite (.ci/run)",
    "git diff constraints/": "shows what a refresh changed",
    "tests/make_envs.sh": _SETUP,
    "tests/workloads/mxnet/make_venv.sh": _SETUP,
    "pip install 'traceview[dask]'": _SETUP,
    "pip install -e '.[mpi]'": _SETUP,
    "python -m pytest": "the test suite this test is part of",
    "python -m pytest tests/unit -q -x": "the test suite this test is part of",
    "ruff check . && ruff format --check .": "the linters; .ci/run and the contributors run them",
    "mypy traceview": "the type check; the contributors run it",
    "mkdocs build --strict --site-dir /tmp/traceview-site": "builds the site; .ci/run runs it "
    "(mkdocs is in the dev extra, not in every test environment)",
    ".venv/bin/python benchmarks/bench_tui.py --repeat 7": "a benchmark (minutes): its figures "
    "are on the page, with the date they were measured",
    "traceview collect -o runs/bs256 -- torchrun --nproc-per-node 8 examples/train.py "
    "--batch-size 256": "8 ranks are too many for the 2-core test machines; test_collect.py "
    "runs torchrun with 2",
    "traceview collect --steps 10 --warmup 3 --skip 20 -- srun -n 16 python examples/train.py": (
        "needs a Slurm cluster"
    ),
    "traceview collect -- .venv-mxnet/bin/python train.py": "train.py stands for the reader's "
    "MXNet script; test_mxnet.py runs real MXNet jobs under collect",
    "traceview collect -- traceview-dmlc -n 2 -s 1 .venv-mxnet/bin/python train.py": "train.py "
    "stands for the reader's MXNet script; test_mxnet.py runs real dist_sync jobs",
    "traceview collect -- .venv-chainer/bin/python train.py": "train.py stands for the "
    "reader's Chainer script; test_chainer.py runs real Chainer jobs under collect",
    "traceview collect -- .venv-chainer/bin/mpirun -np 2 .venv-chainer/bin/python train.py": (
        "train.py stands for the reader's ChainerMN script; test_chainer.py runs a real 2-rank "
        "ChainerMN job under collect"
    ),
    "traceview tui sample_traces/pytorch/ddp": "interactive; test_tui_tmux.py drives the TUI "
    "in a real terminal",
    "traceview ingest sample_traces/pytorch/ddp -o runs/ddp && traceview tui runs/ddp": (
        "interactive; test_tui_tmux.py drives the TUI in a real terminal"
    ),
    "traceview tui runs/np2": "interactive; test_tui_tmux.py drives the TUI in a real terminal",
    "traceview watch runs/np2": "interactive, and meant for a job still running; "
    "test_watch.py watches a running job in a real terminal (tmux)",
    "traceview profile runs/np2 --steps 5": "asks a running job (runs/np2 has ended: refused, "
    "exit 2); test_watch.py asks a running job for a window",
    "traceview report runs/np2 --window 1": "window 1 exists once a running job was asked for "
    "it; test_watch.py reports such a window",
    "traceview tui runs/ddp runs/explicit": "interactive; test_tui.py opens the compare screen",
    "traceview tui sample_traces/{pytorch,tensorflow}/explicit sample_traces/{mxnet,chainer}/mlp": (
        "interactive; test_tui.py opens the compare screen of these four runs"
    ),
    "traceview tui a/rank-0.json a/rank-1.json --compare b/rank-0.json --compare b/rank-1.json": (
        "interactive, and a/ and b/ stand for the reader's traces"
    ),
    **dict.fromkeys(
        [
            "traceview ingest /shared/job-42/traces -o /shared/job-42/run --scheduler "
            "tcp://10.0.0.1:8786",
            "traceview ingest /shared/job-42/traces -o /shared/job-42/run --scheduler-file "
            "~/scheduler.json",
            "TRACEVIEW_SCHEDULER=tcp://10.0.0.1:8786 traceview ingest ...",
            "dask scheduler --scheduler-file ~/scheduler.json &",
            "srun -N 16 dask worker --scheduler-file ~/scheduler.json --nthreads 1 &",
        ],
        _CLUSTER,
    ),
}


@dataclass
class Command:
    page: Path
    line: int  # in the page
    kind: str  # bash, example (a `$` line, with the output the page shows) or python
    text: str
    shown: tuple[str, ...] = ()  # an example's output, as the page shows it

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).strip()


def commands(page: Path) -> list[Command]:
    """The commands of one page, in page order."""
    out: list[Command] = []
    lines = page.read_text().splitlines()
    fence: str | None = None
    start = 0
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            if fence is None:
                fence, start = line[3:].strip(), number
            else:
                block = lines[start : number - 1]
                if fence == "python":
                    out.append(Command(page, start, "python", "\n".join(block)))
                elif fence == "" and block and block[0].startswith("$ "):
                    # an example output: the command, then what it prints
                    text = re.sub(r"\s{2,}\(.*\)$", "", block[0][2:]).strip()
                    out.append(Command(page, start + 1, "example", text, tuple(block[1:])))
                fence = None
            continue
        if fence == "bash" and _strip_comment(line):
            out.append(Command(page, number, "bash", _strip_comment(line)))
    return out


def all_commands() -> list[Command]:
    return [c for page in pages() for c in commands(page)]


def output_matches(shown: tuple[str, ...], printed: list[str]) -> bool:
    """Whether ``printed`` reads as ``shown``, a line ``…`` or ``...`` standing for any lines."""
    want = [s.rstrip() for s in shown]
    got = [p.rstrip() for p in printed]
    # positions in `got` that can follow the part of `want` matched so far
    reachable = {0}
    for line in want:
        if line in ("…", "..."):
            reachable = set(range(min(reachable), len(got) + 1)) if reachable else set()
        else:
            reachable = {j + 1 for j in reachable if j < len(got) and got[j] == line}
        if not reachable:
            return False
    return len(got) in reachable


def copy_screenshots() -> list[str]:
    """Copy the TUI snapshots into docs/img/tui/; the names of those that changed."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    changed = []
    for snapshot in sorted(SNAPSHOTS.glob("*.svg")):
        target = SCREENSHOTS / snapshot.name
        if not target.exists() or target.read_bytes() != snapshot.read_bytes():
            shutil.copyfile(snapshot, target)
            changed.append(snapshot.name)
    for stale in sorted(SCREENSHOTS.glob("*.svg")):
        if not (SNAPSHOTS / stale.name).exists():
            stale.unlink()
            changed.append(stale.name)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["--copy-screenshots"]:
        print("\n".join(copy_screenshots()) or "docs/img/tui/ is up to date")
    else:
        print("usage: python -m tests.docs_pages --copy-screenshots", file=sys.stderr)
        sys.exit(2)
