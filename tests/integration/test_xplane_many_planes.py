"""Issue 55: an XPlane profile of 1,000 GPU planes, read under an address-space limit as a
cluster's ``ulimit -v`` sets one. xprof derives each GPU plane's lines on a thread of its own
(8 MB of stack each): whole, the profile needs 8 GB of address space and xprof aborts, which
ended ``report`` with exit 134 and no word. Read a batch of planes at a time it reports; and
where xprof dies all the same (here made to, by converting the planes in one batch), the file
is refused with one line and exit 2.

The profile: TensorFlow's own CPU sample (not yet grouped into steps, as TensorFlow writes
them) with 1,000 GPU planes added, each without events.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES

pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof: pip install '.[tensorflow]'")
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="ulimit -v, and the child xprof runs in"
)

SAMPLE = SAMPLES / "tensorflow" / "mwms" / "rank-0.xplane.pb"
GIB = 1024**3
# `python -m traceview`, its planes converted in one batch (as before the fix)
_ONE_BATCH = (
    "import runpy, sys\n"
    "import traceview.parsers.xplane_batches as B\n"
    "B.batch_size = lambda: 10**6\n"
    "sys.argv = ['traceview', *sys.argv[1:]]\n"
    "runpy.run_module('traceview', run_name='__main__', alter_sys=True)\n"
)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def gpu_planes(raw: bytes, count: int, first_id: int = 100) -> bytes:
    """The XSpace ``raw`` with ``count`` GPU planes more, without lines (ids from
    ``first_id``: one of them is 700, whose process xprof would give the host's threads)."""
    planes = []
    for n in range(count):
        name = f"/device:GPU:{n}".encode()
        plane = b"\x08" + _varint(first_id + n) + b"\x12" + _varint(len(name)) + name
        planes.append(b"\x0a" + _varint(len(plane)) + plane)
    return raw + b"".join(planes)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("planes") / "rank-0.xplane.pb"
    path.write_bytes(gpu_planes(SAMPLE.read_bytes(), 1000))
    return path


def _limited(
    vsize: int, *argv: str, program: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m traceview ARGV`` (or ``python -c PROGRAM ARGV``) with an address space of
    ``vsize`` bytes and threads' stacks of 8 MB (the usual default)."""
    python = ["-c", program] if program else ["-m", "traceview"]
    command = 'ulimit -s 8192 2>/dev/null; ulimit -v "$1"; shift; exec "$@"'
    return subprocess.run(
        ["bash", "-c", command, "bash", str(vsize // 1024), sys.executable, *python, *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("gib", [4, 8])
def test_a_thousand_gpu_planes_report_under_an_address_space_limit(profile: Path, gib: int) -> None:
    result = _limited(gib * GIB, "report", str(profile))
    assert result.returncode == 0, result.stderr
    assert "1 rank" in result.stdout
    assert "xprof died" not in result.stderr and "Traceback" not in result.stderr


def test_planes_without_events_leave_the_hosts_report_as_it_was(
    profile: Path, tmp_path: Path
) -> None:
    """The host's steps and work, read from the 1,000-plane profile, are the sample's (xprof
    named GPU:600's process, plane id 700, as the host's threads: each keeps its own)."""
    alone = tmp_path / "rank-0.xplane.pb"
    shutil.copyfile(SAMPLE, alone)
    reports = []
    for path in (profile, alone):
        result = _limited(4 * GIB, "report", "--json", str(path))
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        report["run"].pop("run_id")
        reports.append(report)
    assert reports[0]["run"]["ranks"] == 1 and reports[0]["run"]["steps"] == 5
    assert reports[0] == reports[1]


def test_where_xprof_dies_anyway_the_file_is_refused_in_one_line(profile: Path) -> None:
    result = _limited(4 * GIB, "report", str(profile), program=_ONE_BATCH)
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(profile) in lines[0] and "xprof died reading this profile" in lines[0]
    assert "SIGABRT" in lines[0] and "pthread_create" in lines[0]
