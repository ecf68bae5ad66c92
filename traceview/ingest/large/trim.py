"""Memory a large ingest has freed, handed back to the system (glibc keeps it otherwise)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

#: Memory freed by chunks and kept by glibc (the process's RSS above what it was after the last
#: hand-back) that is handed back to the system. Handing it back after every chunk kept the peak
#: 70-100 MB lower, but the next chunk faulted the same pages in again: 0.7 s of a 1 GB trace's
#: 7.3 s, 5 s of a 4 GB trace's 29 s.
TRIM_SLACK = 128 << 20


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
