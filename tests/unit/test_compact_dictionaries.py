"""A batch of a trace read whole keeps the whole trace's dictionaries (``WholeRead``): each
batch's dictionary columns are cut to the values their rows use (``compact_dictionaries``),
the rows' values, nulls and the dictionary's order unchanged."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import REPO
from traceview.model import schema as S
from traceview.model.columns import compact_dictionaries


def _batch(values: list[str | None], dictionary: list[str], other: list[int]) -> pa.RecordBatch:
    codes = [None if v is None else dictionary.index(v) for v in values]
    names = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(dictionary))
    return pa.record_batch([names, pa.array(other, pa.int64())], names=["name", "n"])


def test_a_dictionary_is_cut_to_the_values_used_in_their_order() -> None:
    dictionary = [f"step#{i}" for i in range(1000)] + ["mm", "relu"]
    values = ["relu", "step#7", None, "mm", "step#3", "relu", None, "step#7"]
    batch = _batch(values, dictionary, list(range(len(values))))
    compact = compact_dictionaries(batch)
    names = compact.column(0)
    assert names.to_pylist() == values
    # (the used values in the order the whole dictionary holds them)
    assert names.dictionary.to_pylist() == ["step#3", "step#7", "mm", "relu"]
    assert names.null_count == 2 and names.type == batch.column(0).type
    assert compact.schema == batch.schema and compact.column(1) == batch.column(1)


def test_a_batch_whose_dictionaries_are_all_used_is_left_as_it_is() -> None:
    batch = _batch(["a", "b", "a"], ["a", "b"], [1, 2, 3])
    assert compact_dictionaries(batch).column(0).dictionary == batch.column(0).dictionary
    plain = pa.record_batch([pa.array(["x", None])], names=["name"])
    assert compact_dictionaries(plain).equals(plain)


def test_random_slices_keep_their_values() -> None:
    rng = np.random.default_rng(7)
    dictionary = [f"v{i}" for i in range(500)]
    values = [
        None if rng.random() < 0.1 else dictionary[int(k)] for k in rng.integers(0, 500, 5000)
    ]
    whole = _batch(values, dictionary, list(range(len(values))))
    for offset in range(0, 5000, 777):
        piece = whole.slice(offset, 600)
        compact = compact_dictionaries(piece)
        assert compact.column(0).to_pylist() == piece.column(0).to_pylist()
        used = {v for v in piece.column(0).to_pylist() if v is not None}
        assert sorted(compact.column(0).dictionary.to_pylist()) == sorted(used)


def test_a_chainer_trace_read_whole_hands_on_batches_of_their_own_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bundled Chainer run (5 steps) handed on 32 rows at a time: each batch's names are its
    own rows', not the whole trace's."""
    from traceview.parsers import WholeRead
    from traceview.parsers.chainer import ChainerParser

    source = REPO / "sample_traces" / "chainer" / "mlp" / "rank-0.chainer.json.gz"
    if not source.exists():
        pytest.skip("sample_traces/chainer/mlp is not in this checkout")
    monkeypatch.setattr(WholeRead, "BATCH_ROWS", 32)
    batches = list(ChainerParser().stream(source))
    assert len(batches) >= 4
    names = [set(b.column(S.NAME).to_pylist()) for b in batches]
    assert len(set().union(*names)) > max(len(n) for n in names)  # (batches differ)
    for batch, used in zip(batches, names, strict=True):
        assert len(batch.column(S.NAME).dictionary) == len(used - {None})


def test_a_column_of_nulls_keeps_no_value() -> None:
    batch = _batch([None, None], ["a", "b"], [1, 2])
    names = compact_dictionaries(batch).column(0)
    assert names.to_pylist() == [None, None] and len(names.dictionary) == 0
