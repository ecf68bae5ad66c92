"""A PyTorch rank whose file system fills up: it fills the file system that holds ``BALLAST``
(a file it writes until the disk is full) ``--when before`` it trains or ``after`` it, leaves
``--leave`` bytes free again, and exits with ``--exit``. The training is ddp_train.py's, run
in this process (so this process is the rank that collect profiles)."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fill(ballast: Path, leave: int) -> None:
    try:
        with ballast.open("wb") as file:
            while True:
                file.write(b"\0" * 4096)
                file.flush()
    except OSError:
        pass
    if leave:
        os.truncate(ballast, max(ballast.stat().st_size - leave, 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ballast", type=Path)
    parser.add_argument("--when", choices=("before", "after"), default="before")
    parser.add_argument("--leave", type=int, default=0)
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    if args.when == "before":
        fill(args.ballast, args.leave)
    script = str(HERE / "ddp_train.py")
    sys.argv = [script, "--steps", "8"]
    runpy.run_path(script, run_name="__main__")
    if args.when == "after":
        fill(args.ballast, args.leave)
    sys.exit(args.exit)


if __name__ == "__main__":
    main()
