"""The hostile-input corpus itself (tests/hostile_corpus.py): a case id names the same bytes on
every build. Its runs are tests/integration/test_hostile.py and tests/fuzz/test_hostile.py."""

from __future__ import annotations

from pathlib import Path

from tests import hostile_corpus as H

BY_ID = {c.id: c for c in H.all_cases()}


def test_the_corpus_is_deterministic(tmp_path: Path) -> None:
    """A case id names the same bytes on every build (seeded, nothing from the clock)."""
    for case_id in (
        "kineto-bitflip-gz-3",
        "mxnet-splice-0",
        "xplane-escape-osc-every-string",
        "status-garbage",
        "flight-pickle-inst-opcode",
        "record-steps-cut-mid-row",
        "xdev-steps-on-some-devices",
        "multi-repeat-steps",
    ):
        a = H.build(BY_ID[case_id], tmp_path / "a" / case_id)
        b = H.build(BY_ID[case_id], tmp_path / "b" / case_id)
        files_a = sorted(
            p.relative_to(tmp_path / "a" / case_id)
            for p in (tmp_path / "a" / case_id).rglob("*")
            if p.is_file()
        )
        files_b = sorted(
            p.relative_to(tmp_path / "b" / case_id)
            for p in (tmp_path / "b" / case_id).rglob("*")
            if p.is_file()
        )
        assert files_a == files_b and files_a
        for rel in files_a:
            assert (tmp_path / "a" / case_id / rel).read_bytes() == (
                tmp_path / "b" / case_id / rel
            ).read_bytes(), rel
        assert len(a.runs) == len(b.runs) >= 1
