"""The ops table's lookups done at once (analysis/ops.py): a column's codes into its distinct
values, and the places of a part's keys, against the one-value-at-a-time definitions they
replace for runs of many tiny steps (a dictionary of 100,000 step names, 400,000 groups)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from traceview.analysis.ops import Coded, _codes, _placed, _taken_ints, _taken_strings


def _codes_one_by_one(column: pa.ChunkedArray) -> tuple[list[int], list[str]]:
    """Each row's code into the distinct values in the order the dictionary holds them (a
    null: -1)."""
    array = column.combine_chunks()
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    values = array.dictionary.to_pylist()
    distinct: dict[str, int] = {}
    lut = [distinct.setdefault(str(v), len(distinct)) for v in values]
    return [-1 if i is None else lut[i] for i in array.indices.to_pylist()], list(distinct)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", ["plain", "dictionary", "repeated dictionary"])
def test_a_columns_codes_are_its_values_places(seed: int, shape: str) -> None:
    rng = random.Random(seed)
    names = [f"ProfilerStep#{i}" for i in range(rng.randint(1, 3000))]
    rows = [rng.choice([*names, None]) for _ in range(rng.randint(0, 5000))]
    if shape == "plain":
        column = pa.chunked_array([pa.array(rows, pa.string())])
    else:
        values = names + (names[: len(names) // 2] if shape == "repeated dictionary" else [])
        where = {n: i for i, n in enumerate(values)}  # (a repeated value: its last place)
        indices = pa.array([None if r is None else where[r] for r in rows], pa.int32())
        column = pa.chunked_array([pa.DictionaryArray.from_arrays(indices, pa.array(values))])
    codes, distinct = _codes(column)
    want_codes, want_distinct = _codes_one_by_one(column)
    decoded = [None if c < 0 else distinct[c] for c in codes.tolist()]
    assert decoded == rows
    assert sorted(set(distinct)) == sorted(distinct)  # (each value once)
    assert codes.tolist() == want_codes and distinct == want_distinct


@pytest.mark.parametrize("n", [10, 600, 20_000])
def test_places_of_many_keys_are_those_looked_up_one_by_one(n: int) -> None:
    rng = random.Random(n)
    # a rank's or step's place: where its number is among the sorted distinct numbers
    steps = rng.sample(range(1 << 40), 300)
    place = np.unique(steps)
    index = {v: i for i, v in enumerate(place.tolist())}
    # a part's dictionary: more values than its groups name, a null among them (a step of -1)
    dictionary: list = [*steps, None, (1 << 41) + 5]
    rng.shuffle(dictionary)
    values = [rng.choice([*steps, None]) for _ in range(n)]
    codes = [
        rng.choice([-1, dictionary.index(None)]) if v is None else dictionary.index(v)
        for v in values
    ]
    column = Coded(np.asarray(codes, np.int64), dictionary)
    assert _placed(column, place).tolist() == [-1 if v is None else index[v] for v in values]
    assert column.named_codes().tolist() == sorted({c for c in codes if c >= 0})
    nulls = Coded(np.full(n, -1, np.int64), dictionary)
    assert _placed(nulls, place).tolist() == [-1] * n
    # a named value's (per rank): each group's rank picks the places
    names = [f"op{i}" for i in range(300)]
    by_name = {key: rng.randrange(10_000) for key in names}
    dictionary = [*names, None, "unused"]
    rng.shuffle(dictionary)
    values = [rng.choice([*names, None]) for _ in range(n)]
    codes = [
        rng.choice([-1, dictionary.index(None)]) if v is None else dictionary.index(v)
        for v in values
    ]
    column = Coded(np.asarray(codes, np.int64), dictionary)
    ranks = [3, 7]
    per_rank = {r: {k: p + r for k, p in by_name.items()} for r in ranks}
    rank_codes = [rng.randrange(2) for _ in range(n)]
    by_rank = _placed(column, per_rank, Coded(np.asarray(rank_codes, np.int64), ranks))
    assert by_rank.tolist() == [
        -1 if v is None else per_rank[ranks[r]][v] for r, v in zip(rank_codes, values, strict=True)
    ]
    assert isinstance(by_rank, np.ndarray)


def test_the_tables_strings_and_steps_are_taken_by_code() -> None:
    """A merged group's key or name is its code's value; a code of -1 is an empty string (a
    group without a name) or a null step."""
    codes = np.array([2, -1, 0, 0, 1, -1], np.int64)
    assert _taken_strings(["a", "b", None], codes).to_pylist() == ["", "", "a", "a", "b", ""]
    assert _taken_ints([-7, 3, 1 << 40], codes).to_pylist() == [1 << 40, None, -7, -7, 3, None]
    assert _taken_strings([], np.full(2, -1, np.int64)).to_pylist() == ["", ""]
    assert _taken_ints([], np.zeros(0, np.int64)).to_pylist() == []
