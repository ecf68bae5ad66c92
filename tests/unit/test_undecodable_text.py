"""A file name's bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape: byte
0xNN is U+DCNN). No UTF-8 writer takes them, so wherever traceview writes or shows text they
are written as the bytes they stand for, ``\\xNN``; every other character is left alone."""

from __future__ import annotations

import json
import os

import msgspec

from traceview.model.escape import encodable, safe, undecodable_escaped
from traceview.model.results import Result
from traceview.store.rundir import write_json

NAME = os.fsdecode(b"run\xff-\xc3\xa9-\xe9")  # 0xff, then a UTF-8 é, then a Latin-1 é


def test_undecodable_bytes_are_written_as_the_bytes_they_stand_for() -> None:
    assert NAME == "run\udcff-é-\udce9"
    assert undecodable_escaped(NAME) == "run\\xff-é-\\xe9"
    assert safe(NAME) == "run\\xff-é-\\xe9"
    assert undecodable_escaped("plain é ✓") == "plain é ✓"


def test_every_string_of_a_record_is_escaped_keys_included() -> None:
    value = {NAME: [NAME, {"k": (NAME, 3)}], "n": 1.5, "none": None}
    assert encodable(value) == {
        "run\\xff-é-\\xe9": ["run\\xff-é-\\xe9", {"k": ["run\\xff-é-\\xe9", 3]}],
        "n": 1.5,
        "none": None,
    }


def test_a_manifest_holding_such_a_name_is_valid_utf8_json(tmp_path) -> None:
    write_json(tmp_path / "m.json", {"inputs": [NAME], "plain": "é"})
    data = (tmp_path / "m.json").read_bytes()
    assert json.loads(data.decode("utf-8")) == {"inputs": ["run\\xff-é-\\xe9"], "plain": "é"}
    assert msgspec.json.decode(data)["inputs"] == ["run\\xff-é-\\xe9"]


def test_a_result_holding_such_a_name_encodes() -> None:
    class Named(Result):
        path: str

    assert json.loads(Named(path=NAME).to_json()) == {"path": "run\\xff-é-\\xe9"}
