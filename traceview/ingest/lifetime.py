"""How long the ingest's other processes live: no longer than the ingest that started them."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent(parent: int) -> None:
    """This process ends when ``parent`` (the ingest that started it) does, even when that one
    is killed (SIGKILL runs no cleanup: its helpers and pool workers, ~180 MB each, and the
    resource tracker used to live on). Linux's PR_SET_PDEATHSIG; elsewhere only the check
    below. (Also the initializer of the ingest's pool of workers.)"""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)
