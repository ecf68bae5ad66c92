#!/usr/bin/env python3
"""Run one command and measure its wall time and peak memory; used by bench_ingest.py.

    python _measure.py RESULT.json -- COMMAND [ARG...]

Why a separate launcher: on Linux a child's ru_maxrss starts from the RSS of the process
that forked (or vforked) it and survives execve, so measuring from the benchmark harness,
which has touched hundreds of MB itself, would report the harness's peak for every small
run. This launcher is small (~10 MB), so the peak it reports (wait4's ru_maxrss) is the
command's own. It also samples the RSS and PSS of the command's whole process tree, for
loaders that fork workers (HTA parses several ranks in a process pool); PSS counts pages
shared between a parent and its forked workers once. It also records how much CPU time
other processes used during the run (the machine may be shared). Standard library only.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the comm field may contain spaces and parentheses: split after the last ")"
        rest = stat[stat.rfind(b")") + 2 :].split()
        parent[int(name)] = int(rest[1])
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE_KB
    except (OSError, IndexError, ValueError):
        return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return _rss_kb(pid)


class Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.rss_peak_kb = self.pss_peak_kb = self.max_procs = self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        # Walking /proc for the tree and reading PSS (smaps_rollup walks the page tables) cost
        # milliseconds each: done every ~0.1 s, RSS of the known processes at every sample
        # (at every one, a two-process run lost ~1.5 s of a core to the sampler; every 0.5 s,
        # the peak PSS of a 3 s run of two processes read up to 60 MB low, by when it fell)
        every = max(1, round(0.1 / self.interval)) if self.interval > 0 else 1
        pids: list[int] = []
        while not self.done.is_set():
            full = self.samples % every == 0
            if full:
                pids = _descendants(self.pid)
            self.max_procs = max(self.max_procs, len(pids))
            rss = sum(_rss_kb(p) for p in pids)
            self.rss_peak_kb = max(self.rss_peak_kb, rss)
            if full:
                # PSS only matters (and is only paid for) when several processes share pages
                pss = sum(_pss_kb(p) for p in pids) if len(pids) > 1 else rss
                self.pss_peak_kb = max(self.pss_peak_kb, pss)
            self.samples += 1
            self.done.wait(self.interval)


def _busy_s() -> float:
    """CPU seconds all CPUs spent busy since boot (from /proc/stat)."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal ...
    busy = f[0] + f[1] + f[2] + sum(f[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def compiled(python: str) -> None:
    """The traceview that ``python`` imports compiled to bytecode, as a wheel's install has it
    (where PYTHONDONTWRITEBYTECODE is set, an editable install compiles every module in every
    measured process otherwise)."""
    where = (
        "import os, traceview, traceview.parsers as p, traceview.collectors as c; "
        "print('\\n'.join(os.path.dirname(m.__file__) for m in (traceview, p, c)))"
    )
    found = subprocess.run([python, "-c", where], check=True, capture_output=True, text=True)
    subprocess.run(
        [python, "-m", "compileall", "-q", *found.stdout.split()],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main() -> int:
    result_path = sys.argv[1]
    sep = sys.argv.index("--")
    argv = sys.argv[sep + 1 :]
    interval = float(os.environ.get("BENCH_SAMPLE_INTERVAL", "0.05"))
    load_before = os.getloadavg()
    me0 = resource.getrusage(resource.RUSAGE_SELF)
    own0 = me0.ru_utime + me0.ru_stime
    busy0 = _busy_s()
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    sampler = Sampler(p.pid, interval)
    sampler.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    busy = _busy_s() - busy0
    me = resource.getrusage(resource.RUSAGE_SELF)  # this launcher, sampling included
    mine = me.ru_utime + me.ru_stime - own0
    sampler.done.set()
    sampler.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    with open(result_path, "w") as fh:
        json.dump(
            {
                "rc": p.returncode,
                "proc_s": wall,
                "maxrss_kb": ru.ru_maxrss,
                "tree_rss_peak_kb": sampler.rss_peak_kb,
                "tree_pss_peak_kb": sampler.pss_peak_kb,
                "max_procs": sampler.max_procs,
                "samples": sampler.samples,
                "user_s": ru.ru_utime,
                "sys_s": ru.ru_stime,
                "launcher_cpu_s": mine,
                # CPU time that other processes used meanwhile: how much the machine was
                # shared during the run
                "foreign_cpu_s": max(0.0, busy - ru.ru_utime - ru.ru_stime - mine),
                "loadavg_before": load_before,
            },
            fh,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
