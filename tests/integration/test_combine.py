"""A run is the combination of its ranks' parts, wherever each was computed: the parts of
ingest_rank, one rank at a time and in any order, combine into exactly what a whole ingest
writes (the unit of work the scale-out issue distributes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SAMPLES, beyond_unit
from tests.unit.test_combine import _parts_combine_into_the_whole_run


@pytest.mark.parametrize(
    "sample",
    beyond_unit(["pytorch/ddp", "mxnet/dist_sync", "tensorflow/mwms"], lambda s: (SAMPLES / s,)),
)
def test_parts_combine_into_the_whole_run(sample: str, tmp_path: Path) -> None:
    _parts_combine_into_the_whole_run(sample, tmp_path)
