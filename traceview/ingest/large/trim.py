"""Memory a large ingest has freed, handed back to the system (glibc keeps it otherwise), and
polars' allocator told to hand it back at once where a command reads a large trace."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceview.store.names import MANIFEST

#: Memory freed by chunks and kept by glibc (the process's RSS above what it was after the last
#: hand-back) that is handed back to the system. Handing it back after every chunk kept the peak
#: 70-100 MB lower, but the next chunk faulted the same pages in again: 0.7 s of a 1 GB trace's
#: 7.3 s, 5 s of a 4 GB trace's 29 s (200,000-event chunks). The ingest's process hands back at
#: 32 MB, its helper (``worker``) at ``HELPER_TRIM_SLACK``: the helper's analysis paces a large
#: rank, so its faults are the rank's time, while the ingest waits for it anyway. On the 1.02 GB
#: trace, both at 128 MB: 8.9-9.1 s, 466-467 MB; the ingest at 32 MB: 8.9 s, 420-426 MB; the
#: helper at 32 MB too: 10.0-10.2 s, 425-434 MB (the 108.5 MB and 4.1 GB traces: the same time
#: and peak either way). Once the helper held less (2026-12-06: its sink, memory lookups and
#: kernel launches), 64 MB: the 1 GB GPU trace 374-410 MB in 9.5-10.3 s against 419-430 MB in
#: 10.9-11.6 s at 128 MB (three rounds, alternated); 32 MB: 372-378 MB but 1.3x the time.
TRIM_SLACK = 32 << 20
HELPER_TRIM_SLACK = 64 << 20


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_trimmed_at = 0  # RSS after the last hand-back


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # (no /proc: hand back every time)
        return 1 << 62


def release_memory(*, now: bool = False) -> None:
    """Hand the memory freed by chunks back to the system once it is ``TRIM_SLACK`` (glibc
    keeps it otherwise, and the next chunk's allocations land beside it: the peak would grow by
    a chunk's worth each chunk); ``now``: at once (after a pass whose arrays are gone)."""
    global _trimmed_at
    libc = _libc()
    if libc is not None and (now or _rss() - _trimmed_at > TRIM_SLACK):
        libc.malloc_trim(0)
        _trimmed_at = _rss()


_LIBC: list[Any] = []  # (found once, when first asked: ctypes.util costs a command ~13 ms)


def _libc() -> Any:
    if not _LIBC:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(libc if hasattr(libc, "malloc_trim") else None)
        except OSError:  # not glibc (macOS, musl): nothing to hand back this way
            _LIBC.append(None)
    return _LIBC[0]


#: A command given a trace at least this large (bytes on disk, a gzip file 8 times its size; of
#: a run directory, its largest rank's trace as ingested) has polars' allocator (jemalloc) hand
#: freed pages back at once, not half a second to a second later (polars' own setting, which
#: this one follows and overrides): a long step's critical path is built, walked and replayed
#: stage after stage within that time, and the pages jemalloc keeps are not numpy's to reuse.
#: The 1.02 GB one-step trace (2 cores, alternated): the ingest peaks at 390-392 MB against
#: 482-492 MB with polars' setting, in the same time. The price where nothing is saved: the
#: 4.10 GB trace of 1,230 steps took 64.7-72.2 s against 61.6-65.6 s (4 rounds; the same
#: peak); 100,000 tiny Kineto steps (47 MB, not affected: below) took 10% longer with it.
PROMPT_FROM_BYTES = 256 << 20
POLARS_ALLOCATOR = "_RJEM_MALLOC_CONF"  # (read once, when polars is loaded)
_AT_ONCE = "dirty_decay_ms:0,muzzy_decay_ms:0"
_LOOK_AT = 512  # entries of a folder looked at (a folder of more is many ranks, each smaller)
_BYTES_READ = re.compile(rb'"bytes_read":\s*(\d+)')


def hand_back_promptly(paths: Sequence[Path]) -> None:
    """Have polars' allocator hand freed pages back at once where ``paths`` hold a large trace
    (``PROMPT_FROM_BYTES``): set before polars is loaded, and never over the user's setting."""
    if "polars" in sys.modules or POLARS_ALLOCATOR in os.environ:
        return
    if largest_trace(paths) >= PROMPT_FROM_BYTES:
        os.environ[POLARS_ALLOCATOR] = _AT_ONCE


def largest_trace(paths: Sequence[Path]) -> int:
    """The bytes of the largest trace among ``paths`` (files, folders of traces, run
    directories: their manifest's largest rank), a gzip file counted 8 times; what cannot be
    read counts nothing."""
    largest, budget = 0, _LOOK_AT
    for path in paths:
        name = os.fspath(path)
        try:
            if not os.path.isdir(name):
                largest = max(largest, _weighted(name))
                continue
            manifest = os.path.join(name, MANIFEST)
            if os.path.isfile(manifest):
                with open(manifest, "rb") as fh:
                    read = [int(m) for m in _BYTES_READ.findall(fh.read())]
                largest = max([largest, *read])
                continue
            for top, dirs, files in os.walk(name):
                budget -= len(dirs) + len(files)
                if budget < 0:
                    return largest
                largest = max([largest, *(_weighted(os.path.join(top, f)) for f in files)])
        except (OSError, ValueError):
            continue
    return largest


def weighted_bytes(name: str, size: int) -> int:
    """A trace's bytes on disk as its work goes: a gzip file counts 8 times its size."""
    return size * (8 if name.endswith(".gz") else 1)


def _weighted(name: str) -> int:
    try:
        return weighted_bytes(name, os.path.getsize(name))
    except OSError:
        return 0
