"""The events row (slurmrl.contract.events): written whole, read back equal, bad lines skipped."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir


def test_round_trip_and_order(tmp_path):
    path = RunDir(tmp_path).events
    a = events.Event("died", "inference", task=1, node="n2", cause="exited with code 137 (SIGKILL)", attempt=0)
    b = events.Event("restarted", "inference", task=1, node="n2", attempt=0, detail={"restarts": 1})
    events.append(path, a)
    events.append(path, b)
    assert events.read(path) == [a, b]


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="not one of"):
        events.Event("exploded", "inference")


@given(st.text(max_size=80))
def test_a_line_that_is_not_an_event_is_skipped(tmp_path_factory, junk):
    path = tmp_path_factory.mktemp("ev") / "events.jsonl"
    good = events.Event("dead", "judge", task=0)
    events.append(path, good)
    with open(path, "a") as f:
        f.write(junk.replace("\n", " ") + "\n")
    events.append(path, good)
    assert events.read(path) == [good, good] or events.read(path)[0] == good


def test_missing_fifo_or_folder_reads_as_none(tmp_path):
    assert events.read(tmp_path / "absent") == []
    os.mkfifo(tmp_path / "fifo")
    assert events.read(tmp_path / "fifo") == []
    assert events.read(tmp_path) == []
