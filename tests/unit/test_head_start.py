"""A TensorFlow profile's conversion begun as the command starts (traceview/ingest/head_start.py,
parsers/xplane_batches.py: ``head_start``): which paths get one, that the read takes it over and
gets what it would have read itself, that a file changed since is read afresh, and that a
conversion no read took is stopped."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES
from traceview.ingest import head_start as H
from traceview.parsers import native_child as N
from traceview.parsers import xplane_batches as XB

MWMS = SAMPLES / "tensorflow" / "mwms"
needs_fork = pytest.mark.skipif(
    not N.forks() or N.cores() < 2, reason="begun in a forked child (Linux, 2 cores or more)"
)


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_the_one_profile_given_or_held_by_a_folder_is_the_one_begun(tmp_path: Path) -> None:
    one = _touch(tmp_path / "a" / "plugins" / "profile" / "2026" / "host.xplane.pb")
    _touch(tmp_path / "a" / "events.out.tfevents.1")
    assert H.the_profile([one]) == one
    assert H.the_profile([tmp_path / "a"]) == one
    assert H.the_profile([tmp_path / "a", tmp_path / "nothing-here"]) == one


def test_several_profiles_none_and_run_directories_begin_nothing(tmp_path: Path) -> None:
    a = _touch(tmp_path / "two" / "a.xplane.pb")
    _touch(tmp_path / "two" / "b.xplane.pb")
    assert H.the_profile([tmp_path / "two"]) is None  # (ranks: each read by a worker)
    assert H.the_profile([a, tmp_path / "two" / "b.xplane.pb"]) is None
    assert H.the_profile([_touch(tmp_path / "t.pt.trace.json")]) is None
    run = tmp_path / "run"
    _touch(run / "raw" / "rank-0" / "h.xplane.pb")
    _touch(run / "manifest.json")
    assert H.the_profile([run]) is None  # (a run is read from its tables)


def test_a_folder_of_many_entries_is_not_searched_to_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(H, "_LOOK_AT", 10)
    for n in range(20):
        _touch(tmp_path / "many" / f"{n:02}.json")
    _touch(tmp_path / "many" / "zz" / "h.xplane.pb")
    assert H.the_profile([tmp_path / "many"]) is None


def _read(path: Path) -> tuple[Any, Any]:
    from traceview.parsers import tensorflow as T

    return XB.trace_events(T._require_xprof, path, T._native_error)


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof")
    return Path(shutil.copy(MWMS / "rank-0.xplane.pb", tmp_path / "rank-0.xplane.pb"))


@needs_fork
def test_the_read_takes_the_conversion_begun_and_reads_what_it_would_have(profile: Path) -> None:
    alone = _read(profile)
    H.begin([profile.parent])
    begun = XB._HEAD_STARTS.get(os.path.abspath(profile))
    assert begun is not None
    taken = _read(profile)
    assert not XB._HEAD_STARTS and begun[1].done  # (taken over, not converted again)
    assert all(a.equals(b) for a, b in zip(alone, taken, strict=True))


@needs_fork
def test_a_profile_changed_since_its_conversion_began_is_read_afresh(profile: Path) -> None:
    other = _read(MWMS / "rank-1.xplane.pb")
    H.begin([profile])
    begun = XB._HEAD_STARTS[os.path.abspath(profile)][1]
    shutil.copy(MWMS / "rank-1.xplane.pb", profile)  # (another size and time)
    read = _read(profile)
    assert begun.done and not XB._HEAD_STARTS
    assert all(a.equals(b) for a, b in zip(other, read, strict=True))
    with pytest.raises(ChildProcessError):  # (ended and reaped)
        os.waitpid(begun.pid, os.WNOHANG)


@needs_fork
def test_a_conversion_no_read_took_is_stopped_when_the_command_ends(profile: Path) -> None:
    H.begin([profile])
    child = XB._HEAD_STARTS[os.path.abspath(profile)][1]
    H.end()
    assert not XB._HEAD_STARTS and child.done
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)


@needs_fork
def test_the_command_reads_a_profile_begun_and_leaves_no_child(
    profile: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from traceview.cli import main

    claimed: list[N.Child | None] = []
    claim = XB._claimed
    monkeypatch.setattr(XB, "_claimed", lambda path: claimed.append(claim(path)) or claimed[-1])
    assert main(["report", "--json", str(profile)]) == 0
    assert '"framework":"tensorflow"' in capsys.readouterr().out
    assert len(claimed) == 1 and isinstance(claimed[0], N.Child)
    assert not XB._HEAD_STARTS
    with pytest.raises(ChildProcessError):  # (its child reaped)
        os.waitpid(claimed[0].pid, os.WNOHANG)


@needs_fork
def test_a_command_refused_before_its_read_stops_the_conversion_it_began(
    profile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from traceview.cli import main

    begun: list[N.Child] = []
    start = XB.start_child
    monkeypatch.setattr(XB, "start_child", lambda work: begun.append(start(work)) or begun[-1])
    taken = _touch(tmp_path / "a-file")  # (no run directory can be written there)
    assert main(["ingest", str(profile), "-o", str(taken)]) == 2
    assert len(begun) == 1 and begun[0].done and not XB._HEAD_STARTS
    with pytest.raises(ChildProcessError):
        os.waitpid(begun[0].pid, os.WNOHANG)


def test_a_reader_that_cannot_be_imported_begins_nothing_and_raises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    profile = _touch(tmp_path / "h.xplane.pb")
    monkeypatch.setitem(sys.modules, "traceview.parsers.xplane_batches", None)  # (ImportError)
    H.begin([profile])
    H.end()
