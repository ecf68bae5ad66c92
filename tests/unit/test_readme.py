"""The README's commands, run as a reader would paste them.

What is run: every line of every ```bash block, every `$ command` line of the example outputs
(the first line it prints must be the README's), and every ```python block, in README order, in
one scratch folder that holds links to the repository's `sample_traces/`, `examples/` and
`.venv-mxnet`, with this Python's environment first on PATH (it is the environment "Try it"
makes). Each must exit 0 without a traceback.

What is changed, and why (the only changes):
- `PATH` and `TRACES...` in "Other commands" stand for traces: `sample_traces/pytorch/ddp`.
  (`RUN` is left as written: the ingest line makes a run directory named RUN that the lines
  after it and the Parquet example read.)
- As root, `mpirun` gets `--allow-run-as-root`, as the README tells root users to add.
- MASTER_PORT is set to a free port, so that the example job does not collide with another
  job on the machine (examples/train.py's default is 29500).

What is not run is listed in SKIPPED with the reason (matched on the whole command, its comment
left out); a line listed there that is no longer in the README fails the test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.conftest import REPO

README = REPO / "README.md"

_SETUP = "sets up the environment the test runs in; .ci/run does this from scratch in a clone"
SKIPPED: dict[str, str] = {
    "python3 -m venv .venv && source .venv/bin/activate": _SETUP,
    "pip install -e .": _SETUP,
    "source .venv/bin/activate": _SETUP,
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": _SETUP,
    "pip install tensorflow-cpu==2.21.0 -e '.[dev,mpi,bench,tensorflow,dask]'": _SETUP,
    "tests/make_envs.sh": _SETUP,
    "python -m pytest": "the test suite this test is part of",
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
    "pip install 'traceview[dask]'": _SETUP,
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
        "needs a cluster at that address (and Slurm); test_cluster.py runs a real Dask "
        "cluster on 127.0.0.1",
    ),
}


@dataclass
class Command:
    line: int  # in README.md
    kind: str  # bash, example (a `$` line, with the output the README shows) or python
    text: str
    first_output_line: str = ""


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).strip()


def readme_commands() -> list[Command]:
    commands: list[Command] = []
    lines = README.read_text().splitlines()
    fence: str | None = None
    start = 0
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            if fence is None:
                fence, start = line[3:].strip(), number
            else:
                if fence == "python":
                    commands.append(Command(start, "python", "\n".join(lines[start : number - 1])))
                fence = None
            continue
        if fence == "bash" and _strip_comment(line):
            commands.append(Command(number, "bash", _strip_comment(line)))
        elif fence == "" and line.startswith("$ "):
            # an example output: the command, then what it prints
            text = re.sub(r"\s{2,}\(.*\)$", "", line[2:]).strip()  # "(then 2: ...)" is prose
            commands.append(Command(number, "example", text, lines[number].rstrip()))
    return commands


def test_every_bash_line_is_run_or_skipped_with_a_reason() -> None:
    commands = readme_commands()
    texts = {c.text for c in commands}
    assert {c.kind for c in commands} == {"bash", "example", "python"}
    stale = sorted(set(SKIPPED) - texts)
    assert not stale, f"SKIPPED lists lines the README no longer has: {stale}"
    assert all(reason.strip() for reason in SKIPPED.values())
