"""Where a temporary run is built (store.scratch): shared memory for small inputs where
/dev/shm is a tmpfs with room, the default place otherwise, and never where the user chose
another place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from traceview.runs.opening import open_run
from traceview.store import scratch

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
TMPFS = scratch._shared_memory()
needs_tmpfs = pytest.mark.skipif(not TMPFS, reason="/dev/shm is not a tmpfs here")


@pytest.fixture
def no_chosen_place(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)


def _files(folder: Path, count: int, size: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        (folder / f"rank-{k}.json").write_bytes(b"x" * size)
    return folder


def test_expected_bytes_counts_files_and_bytes(tmp_path: Path) -> None:
    _files(tmp_path / "a", 3, 1000)
    _files(tmp_path / "a" / "deeper", 2, 10)
    single = _files(tmp_path / "b", 1, 5)
    expected = 5 * scratch.PER_FILE_BYTES + scratch.PER_INPUT_BYTE * (3 * 1000 + 2 * 10)
    assert scratch.expected_bytes([tmp_path / "a"], 1 << 40) == expected
    both = scratch.expected_bytes([tmp_path / "a", single / "rank-0.json"], 1 << 40)
    assert both == expected + scratch.PER_FILE_BYTES + scratch.PER_INPUT_BYTE * 5


def test_counting_stops_past_the_limit(tmp_path: Path) -> None:
    _files(tmp_path, 50, 100)
    limit = 10 * scratch.PER_FILE_BYTES
    assert scratch.expected_bytes([tmp_path], limit) == limit + 1


def test_a_link_to_a_folder_is_not_guessed(tmp_path: Path) -> None:
    _files(tmp_path / "real", 1, 10)
    (tmp_path / "given").mkdir()
    (tmp_path / "given" / "linked").symlink_to(tmp_path / "real")
    assert scratch.expected_bytes([tmp_path / "given"], 1 << 40) == (1 << 40) + 1


def test_unreadable_places_count_nothing(tmp_path: Path) -> None:
    assert scratch.expected_bytes([tmp_path / "absent"], 100) == 0


@needs_tmpfs
def test_small_inputs_go_to_shared_memory(tmp_path: Path, no_chosen_place: None) -> None:
    _files(tmp_path, 20, 500)
    assert scratch.scratch_parent([tmp_path]) == scratch.SHARED_MEMORY


@needs_tmpfs
def test_large_inputs_stay_on_disk(tmp_path: Path, no_chosen_place: None) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as out:  # (sparse: its size is what counts)
        out.truncate(scratch.SHARED_MAX_BYTES // scratch.PER_INPUT_BYTE + 1)
    assert scratch.scratch_parent([big]) is None


@pytest.mark.parametrize("name", ["TMPDIR", "TEMP", "TMP"])
def test_a_place_the_user_chose_is_kept(
    tmp_path: Path, no_chosen_place: None, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    _files(tmp_path / "in", 2, 100)
    monkeypatch.setenv(name, str(tmp_path))
    assert scratch.scratch_parent([tmp_path / "in"]) is None


@needs_tmpfs
def test_a_report_of_small_traces_is_built_in_shared_memory_and_removed(
    no_chosen_place: None,
) -> None:
    before = set(os.listdir(scratch.SHARED_MEMORY))
    with open_run([SAMPLES / "pytorch" / "ddp"]) as run:
        assert str(run.path).startswith(scratch.SHARED_MEMORY + "/")
        assert run.report().ranks
    assert set(os.listdir(scratch.SHARED_MEMORY)) - before == set()


def test_a_run_that_shared_memory_cannot_take_is_built_on_disk_after_all(
    tmp_path: Path, no_chosen_place: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared memory that fills while the run is built (another process, or inputs that
    expand more than expected): the run is built again in the default place, the report is
    the same, and nothing is left in either place."""
    from tests.collect_faults import tmpfs

    expected = open_run([SAMPLES / "pytorch" / "ddp"])
    with expected as run:
        first = run.report().to_builtins()
    disk = tmp_path / "disk"
    disk.mkdir()
    with tmpfs(tmp_path / "shm", "64k") as small:
        monkeypatch.setattr(scratch, "SHARED_MEMORY", str(small))
        monkeypatch.setattr(scratch, "PER_FILE_BYTES", 1)  # expected to fit, and does not
        monkeypatch.setattr(scratch, "PER_INPUT_BYTE", 0)
        assert scratch.scratch_parent([SAMPLES / "pytorch" / "ddp"]) == str(small)
        monkeypatch.setattr("tempfile.tempdir", str(disk))
        with open_run([SAMPLES / "pytorch" / "ddp"]) as run:
            assert run.path.is_relative_to(disk)
            again = run.report().to_builtins()
        assert list(small.iterdir()) == []
    assert list(disk.iterdir()) == []
    for report in (first, again):  # (each built with an id of its own)
        report["run"].pop("run_id")
    assert again == first
