"""A broadcast never waits on a server that died: here the server's port answers nothing, so the trainer's
rank 0 drops it from the transfer group before forming one (``transfer_group``): the trainer opens with no
server, its update reaches none, and its record (what the orchestrator reads) names the server and why."""

from __future__ import annotations

import socket

import pytest

from slurmrl.contract import live_set
from slurmrl.contract.weight_sync import Broadcast

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytestmark = pytest.mark.slow  # vLLM's import


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_server_is_dropped_from_the_group_and_named_never_waited_on(tmp_path):
    from slurmrl.runtime.trainer.transfer_group import HEALTH_S
    from slurmrl.runtime.trainer.weight_sync import Broadcaster, Target

    dead = f"http://127.0.0.1:{closed_port()}"
    said: list[str] = []
    target = Target(Broadcast("gloo", 3), [dead], [1], "127.0.0.1", closed_port(), world_size=2,
                    synced=tmp_path / "servers-synced.json")
    sender = Broadcaster(target, torch.nn.Linear(4, 4), rank=0, dtype=torch.float32, log=said.append)
    assert sender.group is not None and sender.group.urls == []
    assert sender.sync(1) is not None  # marked: the servers that come back take the next update
    assert live_set.read_reached(tmp_path / "servers-synced.json") == live_set.Reached(
        1, (), {dead: f"/health did not answer 200 within {HEALTH_S:g}s"})
    assert any(x.startswith("weights of step 1 reached no server: none is live") and dead in x for x in said), said
