"""The contract's reader kit (``slurmrl.contract.reader``): one error naming the file, the line and the
key; the value readers; the bounded reader that opens only a regular file."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from slurmrl.contract import events, reader
from slurmrl.contract.reader import ContractError


@dataclass(frozen=True, kw_only=True)
class Point:
    name: str = field(metadata=reader.spec(reader.TEXT))
    sizes: tuple[int, ...] = field(metadata=reader.spec(reader.list_of(reader.WHOLE)))
    note: str | None = field(default=None, metadata=reader.spec(reader.TEXT, optional=True))


def test_the_error_names_the_file_the_line_and_the_key():
    e = ContractError("m.jsonl", "sizes[1]", "must be a whole number, got str", line=7)
    assert str(e) == "m.jsonl line 7: key 'sizes[1]' must be a whole number, got str"
    assert (e.source, e.line, e.key) == ("m.jsonl", 7, "sizes[1]") and isinstance(e, ValueError)
    assert str(ContractError("f.json", None, "not JSON: x")) == "f.json: not JSON: x"


@pytest.mark.parametrize("data, words", [
    ({"sizes": []}, "f.json: key 'name' is missing"),
    ({"name": 1, "sizes": []}, "f.json: key 'name' must be a string, got int"),
    ({"name": "a", "sizes": [1, True]}, "f.json: key 'sizes[1]' must be a whole number, got bool"),
    ({"name": "a", "sizes": {}}, "f.json: key 'sizes' must be a list, got dict"),
    ({"name": "a", "sizes": [], "note": 3}, "f.json: key 'note' must be a string, got int"),
    ([], "f.json: key '(top)' must be an object, got list"),
])
def test_a_dataclass_read_through_the_kit_names_the_key(data, words):
    with pytest.raises(ContractError) as e:
        reader.parse(Point, data, "f.json")
    assert str(e.value) == words
    assert reader.parse(Point, {"name": "a", "sizes": [2], "note": None}, "f.json") == Point(name="a", sizes=(2,))


def test_json_that_is_not_json_or_too_deep_is_one_line_naming_the_line():
    with pytest.raises(ContractError, match=r"^e.jsonl line 3: not JSON: Expecting"):
        reader.loads('{"a": ', "e.jsonl", 3)
    with pytest.raises(ContractError, match=r"^e.jsonl: is nested more than 64 deep"):
        reader.loads("[" * 100_000, "e.jsonl")
    assert reader.loads('{"x": NaN}', "e.jsonl")["x"] != 0


def test_an_event_line_that_breaks_the_contract_names_its_line(tmp_path):
    path = tmp_path / "events.jsonl"
    with pytest.raises(ContractError) as e:
        events.Event.from_json('{"kind": "dead", "component": 3}', str(path), 2)
    assert str(e.value).startswith(f"{path} line 2: key 'component' must be a string")
    with pytest.raises(ContractError, match=r"line 4: key 'kind' event kind 'exploded' is not one of"):
        events.Event.from_json('{"kind": "exploded", "component": "x", "cause": "", "time": 1, "detail": {}}',
                               "e", 4)


def test_the_bounded_reader_opens_only_a_regular_file(tmp_path):
    (tmp_path / "f").write_bytes(b"0123456789")
    assert reader.read_bounded(tmp_path / "f", 4) == b"0123"
    assert reader.read_bounded(tmp_path / "f", 4, offset=-3) == b"789"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(reader.NotRegular):  # refused before the open: a FIFO cannot block it
        reader.read_bounded(tmp_path / "fifo")
    with pytest.raises(reader.NotRegular):
        reader.read_bounded(tmp_path)
    os.symlink(tmp_path / "f", tmp_path / "link")
    assert reader.read_bounded(tmp_path / "link") == b"0123456789"
    with pytest.raises(reader.NotRegular):  # without follow a link is not read (events.jsonl)
        reader.read_bounded(tmp_path / "link", follow=False)
    with pytest.raises(FileNotFoundError):
        reader.read_bounded(tmp_path / "absent")
