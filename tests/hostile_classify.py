"""Classify the failures of a corpus run.

    HOSTILE_LOG=LOG python -m pytest -m fuzz tests/fuzz/test_hostile.py
    python -m tests.hostile_classify LOG

Problems are grouped by their text (numbers and paths left out, so one message raised in two
places is one group: the table in hostile_run.py was refined case by case). For each group of
internal errors one example run is repeated with ``TRACEVIEW_DEBUG=1`` on inputs rebuilt from
its case id, to name the exception's innermost traceview frame. Prints one block per group:
count of cases, the problem, the frame, example case ids.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

_FRAME = re.compile(r'File "([^"]*/(?:traceview|parsers|collectors)/[^"]+)", line (\d+), in (\S+)')


def rebuilt(case_id: str, argv: list[str]) -> list[str]:
    """``argv`` on a fresh build of the case (pytest's temporary folders do not last)."""
    from tests import hostile_corpus as H

    case = {c.id: c for c in H.all_cases()}[case_id]
    folder = Path(tempfile.mkdtemp(prefix="hostile-classify-")) / case_id
    H.build(case, folder)
    marker = f"/{case_id}"
    return [
        str(folder) + a.split(marker, 1)[1] if marker + "/" in a or a.endswith(marker) else a
        for a in argv
    ]


def where(argv: list[str]) -> str:
    """The innermost traceview frame of the internal error ``argv`` raises."""
    env = {**os.environ, "TRACEVIEW_DEBUG": "1", "COLUMNS": "120"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "traceview", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        return "(rerun timed out)"
    frames = _FRAME.findall(proc.stderr)
    if not frames:
        return "(no traceview frame on rerun)"
    path, line, func = frames[-1]
    return re.sub(r".*/(traceview|parsers|collectors)/", r"\1/", path) + f":{line} ({func})"


def normalize(problem: str) -> str:
    text = re.sub(r"/\S+", "PATH", problem)
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"^`[^`]*`( --json)?: ", "", text)
    return text[:160]


def main(log: str, rerun: bool = True) -> int:
    groups: dict[str, list[str]] = defaultdict(list)
    examples: dict[str, list[str]] = {}
    for line in Path(log).read_text().splitlines():
        record = json.loads(line)
        seen: set[str] = set()
        for problem in record["problems"]:
            if re.search(r"exit code 1$", problem):
                continue  # the internal error line says more
            key = normalize(problem)
            if key in seen:
                continue
            seen.add(key)
            groups[key].append(record["id"])
            if "internal error" in problem and key not in examples:
                cmd = problem.split("`")[1] if problem.startswith("`") else ""
                run = next(
                    (r for r in record["runs"] if r["argv"][0] == cmd and r["code"] == 1), None
                )
                if run and not record["id"].startswith(("output-fsize", "output-readonly")):
                    examples[key] = rebuilt(record["id"], run["argv"])
    for key, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        loc = where(examples[key]) if rerun and key in examples else ""
        print(f"{len(ids):4d}  {key}  {loc}")
        print(f"      e.g. {ids[0]}: {', '.join(ids[1:8])}{' …' if len(ids) > 8 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], rerun="--no-rerun" not in sys.argv))
