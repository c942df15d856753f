"""The live set of servers and a broadcast's record (slurmrl.contract.live_set): each reads back what it
writes, a file that breaks the contract reads as none, a write is whole (a reader never sees half)."""

from __future__ import annotations

import pytest

from slurmrl.contract import live_set
from slurmrl.contract.live_set import LiveSet, Member, Reached


def test_each_reads_back_what_it_writes(tmp_path):
    s = LiveSet("1", (Member("http://n1:8001", "admitted"), Member("http://n2:8001", "waiting", 2),
                      Member("http://n3:8001", "dead", 1)), 5.5)
    live_set.write(tmp_path / "live.json", s)
    assert live_set.read_live(tmp_path / "live.json") == s
    assert [m.url for m in s.in_group()] == ["http://n1:8001", "http://n2:8001"]
    r = Reached(7, ("http://n1:8001",), {"http://n2:8001": "did not join the group within 60s"})
    live_set.write(tmp_path / "synced.json", r)
    assert live_set.read_reached(tmp_path / "synced.json") == r
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json", "synced.json"]  # no temporary left


@pytest.mark.parametrize("text", ["", "{", "[]", '{"attempt": 0, "written": 1, "members": []}',
                                  '{"attempt": "0", "written": 1, "members": [{"url": "u", "state": "gone", '
                                  '"incarnation": 0}]}',
                                  '{"attempt": "0", "written": 1, "members": [], "extra": 1}'])
def test_a_live_set_that_breaks_the_contract_reads_as_none(tmp_path, text):
    (tmp_path / "live.json").write_text(text)
    assert live_set.read_live(tmp_path / "live.json") is None
    assert live_set.read_live(tmp_path / "absent.json") is None


@pytest.mark.parametrize("text", ['{"step": "1", "urls": [], "dropped": {}}', '{"step": 1, "urls": [1], "dropped": {}}',
                                  '{"step": 1, "urls": [], "dropped": {"u": 2}}', '{"step": true, "urls": [], '
                                  '"dropped": {}}'])
def test_a_record_that_breaks_the_contract_reads_as_none(tmp_path, text):
    (tmp_path / "synced.json").write_text(text)
    assert live_set.read_reached(tmp_path / "synced.json") is None


def test_a_state_outside_the_contract_is_refused():
    with pytest.raises(ValueError, match="one of admitted, waiting, dead"):
        Member("http://n1:8001", "restarting")
