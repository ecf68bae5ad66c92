"""Memory a large ingest has freed, handed back to the system (glibc keeps it otherwise)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

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
    if _LIBC is not None and (now or _rss() - _trimmed_at > TRIM_SLACK):
        _LIBC.malloc_trim(0)
        _trimmed_at = _rss()


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): nothing to hand back this way
        return None


_LIBC = _libc()
