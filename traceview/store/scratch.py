"""Where the temporary run of ``report FOLDER`` (and every command given traces) is built.

Such a run lives for one command. Of many small traces it is mostly file-system work: a folder
and a file per rank, made, listed and removed. On a disk-backed ``/tmp`` (ext4 here) that was
about 0.9 ms a rank of the two workers' time and 2.7 s of removal at 20,000 one-step ranks, a
sixth of the command; in shared memory it is a few microseconds. So the temporary run of
inputs small enough goes to ``/dev/shm`` (as joblib puts its temporary folders there first),
unless the user chose a place (``TMPDIR``, ``TEMP`` or ``TMP`` set): it is removed when the
command ends, and it takes memory only while it lives (a command killed outright leaves it, as
it would leave it in ``/tmp``, until the machine restarts). Larger inputs, a missing or small
``/dev/shm`` (a container's is 64 MB by default), or one that cannot be written: the default
place, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED_MEMORY = "/dev/shm"
#: The most a temporary run may be expected to take in shared memory, and the share of its free
#: space it may take.
SHARED_MAX_BYTES = 512 << 20
SHARED_SHARE = 4
#: What a temporary run is expected to take per input file (a rank's folder, its events file
#: and the pages of small files) and per input byte (normalized events, uncompressed when small).
PER_FILE_BYTES = 16 << 10
PER_INPUT_BYTE = 4
#: Inputs looked at before giving up on shared memory (a tree too big to count quickly).
MOST_ENTRIES = 100_000
_CHOSEN_BY_USER = ("TMPDIR", "TEMP", "TMP")


def scratch_parent(paths: list[Path]) -> str | None:
    """The folder to make a temporary run of ``paths`` in: shared memory where the inputs are
    small and it has room, else None (tempfile's default place)."""
    if any(os.environ.get(name) for name in _CHOSEN_BY_USER) or not _shared_memory():
        return None
    try:
        found = os.statvfs(SHARED_MEMORY)
    except OSError:
        return None
    room = min(SHARED_MAX_BYTES, found.f_bavail * found.f_frsize // SHARED_SHARE)
    if expected_bytes(paths, room) > room or not os.access(SHARED_MEMORY, os.W_OK | os.X_OK):
        return None
    return SHARED_MEMORY


def expected_bytes(paths: list[Path], limit: int) -> int:
    """What a temporary run of ``paths`` is expected to take; counting stops past ``limit``
    (or MOST_ENTRIES entries: then more than ``limit``). Unreadable places count nothing: the
    ingest says what they are."""
    total = entries = 0
    todo = [os.fspath(p) for p in paths]
    while todo:
        place = todo.pop()
        try:
            if not os.path.isdir(place):
                total += PER_FILE_BYTES + PER_INPUT_BYTE * os.stat(place).st_size
                entries += 1
            else:
                with os.scandir(place) as listing:
                    for entry in listing:
                        entries += 1
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        elif entry.is_dir():  # (a link to a folder: not counted, not guessed)
                            return limit + 1
                        elif entry.is_file():
                            total += PER_FILE_BYTES + PER_INPUT_BYTE * entry.stat().st_size
                        if total > limit or entries > MOST_ENTRIES:
                            return limit + 1
        except OSError:
            continue
        if total > limit or entries > MOST_ENTRIES:
            return limit + 1
    return total


def _shared_memory() -> bool:
    """``/dev/shm`` is mounted, as tmpfs (not a folder of the root file system)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            return any(
                line.split()[1:3] == [SHARED_MEMORY, "tmpfs"] for line in mounts if line.strip()
            )
    except OSError:
        return False
