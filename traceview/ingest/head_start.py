"""The slowest part of reading a trace begun as the command starts, beside its own imports.

A TensorFlow profile (``.xplane.pb``) is converted by xprof in a child process (seconds for a
large one), and a command imports for ~0.4 s before its read begins that conversion. Where a
command is given one profile (the file, or a folder that holds one and is no run directory),
``begin`` has the conversion start at once (``xplane_batches.head_start``); the read takes it
over, or converts afresh where the file changed since. ``end`` stops what no read took.

Only the standard library is imported here until a profile is found: a command given none
(``report`` of a run, ``--help``) pays nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from traceview.store.names import MANIFEST

_SUFFIX = ".xplane.pb"  # (parsers.tensorflow.SUFFIX, without importing the parsers)
#: Entries a folder's walk looks at before it gives up looking (a folder of many files is many
#: ranks, each read in a worker of its own: no head start there)
_LOOK_AT = 512
_BATCHES = "traceview.parsers.xplane_batches"


def the_profile(paths: Sequence[Path]) -> Path | None:
    """The one TensorFlow profile among ``paths`` and the folders they name, if exactly one."""
    found: list[str] = []
    budget = _LOOK_AT
    for path in paths:
        name = os.fspath(path)
        if name.endswith(_SUFFIX):
            found.append(name)
        elif os.path.isdir(name) and not os.path.exists(os.path.join(name, MANIFEST)):
            for top, dirs, files in os.walk(name):
                budget -= len(dirs) + len(files)
                if budget < 0:
                    return None
                found += [os.path.join(top, f) for f in files if f.endswith(_SUFFIX)]
        if len(found) > 1:
            return None
    return Path(found[0]) if len(found) == 1 else None


def begin(paths: Sequence[Path]) -> None:
    """Begin converting the one profile ``paths`` hold, if they hold one."""
    try:
        profile = the_profile(paths)
    except OSError:
        return
    if profile is None:
        return
    try:
        from traceview.parsers.xplane_batches import head_start
    except ImportError:  # (pyarrow that cannot be imported: the command says so, in one line)
        return
    head_start(profile)


def end() -> None:
    """Stop the conversions begun that no read took."""
    batches = sys.modules.get(_BATCHES)
    if batches is not None:
        batches.cancel_head_starts()
