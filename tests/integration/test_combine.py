"""The integration tier's part of ``tests/unit/test_combine.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

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
