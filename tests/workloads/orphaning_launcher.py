"""A launcher that leaves its ranks behind: it starts ``--ranks`` rank processes, each in a
session of its own (as a launcher that setsids its children does), waits until every rank is
working, prints the ranks' pids (``rank pids: 123 456``) and then ends as ``--end`` says:

- ``kill``: SIGKILL to itself (a launcher killed hard: its ranks are orphaned);
- ``term``: SIGTERM to itself (this script has no handler for it: it dies of it);
- ``exit``: it exits 0 while its ranks still run.

A rank is ``python ddp_train.py --no-ddp`` (``--torch``: PyTorch, profiled by collect) or, by
default, a plain Python loop that appends a line to ``RUN/raw/writer-N/log`` ten times a second
(nothing is written there once it has ended). ``--ignore-term``: the ranks ignore SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

WRITER = """
import os, signal, sys, time
from pathlib import Path
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
folder = Path(os.environ["TRACEVIEW_RUN_DIR"]) / "raw" / f"writer-{sys.argv[1]}"
folder.mkdir(parents=True, exist_ok=True)
while True:
    with open(folder / "log", "a") as log:
        log.write(f"{time.time()}\\n")
    time.sleep(0.1)
"""

IGNORE_TERM = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"


def rank_command(rank: int, torch: bool, ignore_term: bool) -> list[str]:
    if not torch:
        return [sys.executable, "-c", WRITER, str(rank), *(["--ignore-term"] * ignore_term)]
    script = str(HERE / "ddp_train.py")
    code = (
        (IGNORE_TERM if ignore_term else "")
        + f"import runpy, sys; sys.argv = [{script!r}, '--no-ddp', '--steps', '1000000']; "
        + f"runpy.run_path({script!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", code]


def working(rank: int, torch: bool) -> bool:
    raw = Path(os.environ["TRACEVIEW_RUN_DIR"]) / "raw"
    if not torch:
        return (raw / f"writer-{rank}" / "log").is_file()
    return (raw / f"rank-{rank:05d}" / "status.json").is_file()  # (it imported PyTorch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--end", choices=("kill", "term", "exit"), default="kill")
    parser.add_argument("--torch", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    ranks = []
    for rank in range(args.ranks):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(args.ranks)}
        command = rank_command(rank, args.torch, args.ignore_term)
        ranks.append(subprocess.Popen(command, env=env, start_new_session=True))
    deadline = time.monotonic() + 60
    while not all(working(r, args.torch) for r in range(args.ranks)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in ranks):
            sys.exit("a rank never started working")
        time.sleep(0.1)
    print("rank pids:", *(p.pid for p in ranks), flush=True)
    if args.end == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif args.end == "term":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    os._exit(0)  # (the ranks' Popen objects would otherwise be waited for)


if __name__ == "__main__":
    main()
