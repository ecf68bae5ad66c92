"""Files named by step number (``timeline_step_3.json``) that state no rank and no process are
one process's steps (discover.assign_ranks), not ranks; anything that tells them apart keeps
them apart. The traces here are made up: only their names and what they state matter."""

from __future__ import annotations

from pathlib import Path

from traceview.ingest.discover import TraceFile, assign_ranks
from traceview.model.errors import Notes


def _trace(path: str, **stated: object) -> TraceFile:
    return TraceFile(Path(path), "tf_timeline", "tensorflow", size=100, **stated)  # type: ignore[arg-type]


def _ranks(traces: list[TraceFile]) -> dict[int, list[str]]:
    notes = Notes()
    assign_ranks(traces, notes)
    return {t.rank: [str(p) for p in t.files] for t in traces}


def test_one_process_steps_become_one_rank_in_step_order() -> None:
    traces = [_trace(f"out/timeline_step_{n}.json") for n in (10, 2, 1)]
    assert _ranks(traces) == {
        0: ["out/timeline_step_1.json", "out/timeline_step_2.json", "out/timeline_step_10.json"]
    }
    assert traces[0].size == 300


def test_other_spellings_of_a_step_number() -> None:
    for names in (["iter-1.json", "iter-2.json"], ["a_STEP3_b.json", "a_STEP4_b.json"]):
        assert len(_ranks([_trace(f"x/{n}") for n in names])) == 1, names


def test_what_tells_files_apart_keeps_them_apart() -> None:
    # a stated rank, a process id, a host: the files say who wrote them
    assert len(_ranks([_trace(f"t_step_{n}.json", claimed_rank=n) for n in (0, 1)])) == 2
    assert len(_ranks([_trace(f"t_step_{n}.json", process=4000 + n) for n in (0, 1)])) == 2
    assert len(_ranks([_trace(f"t_step_{n}.json", host=f"h{n}") for n in (0, 1)])) == 2
    # other folders, other names around the number, one step number twice, no step word
    assert len(_ranks([_trace(f"r{n}/t_step_1.json") for n in (0, 1)])) == 2
    assert len(_ranks([_trace("a_step_1.json"), _trace("b_step_2.json")])) == 2
    assert len(_ranks([_trace("x/t_step_1.json"), _trace("x/t_step_01.json")])) == 2
    assert len(_ranks([_trace("x/t_1.json"), _trace("x/t_2.json")])) == 2
    # (a word that merely ends in "step" is no step number: footstep_1, footstep_2)
    assert len(_ranks([_trace(f"x/footstep_{n}.json") for n in (1, 2)])) == 2


def test_a_step_grouped_rank_beside_a_single_file_is_no_missing_window() -> None:
    notes = Notes()
    traces = [_trace(f"x/timeline_02_step_{n}.json") for n in range(3)]
    traces.append(_trace("x/timeline_03_merged_5_runs.json"))
    assign_ranks(traces, notes)
    assert [len(t.files) for t in traces] == [3, 1]
    assert not any("fewer trace files" in w for w in notes.warnings)
    assert any("3 files named by step number (0-2)" in r for r in notes.remarks)
