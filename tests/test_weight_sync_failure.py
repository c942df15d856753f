"""A broadcast that cannot reach a server ends the trainer with one line naming that server: here
the server's port answers nothing (a server that died), so the group never forms; the trainer gives
up after trainer.weight_sync_timeout instead of waiting forever."""

from __future__ import annotations

import socket

import pytest

from slurmrl.contract.weight_sync import Broadcast

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytestmark = pytest.mark.slow  # vLLM's import and the 3 s the group is given


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_server_is_named_and_the_wait_is_bounded():
    from slurmrl.runtime.trainer.weight_sync import Broadcaster, SyncFailed, Target

    dead = f"http://127.0.0.1:{closed_port()}"
    target = Target(Broadcast("gloo", 3), [dead], [1], "127.0.0.1", closed_port(), world_size=2)
    with pytest.raises(SyncFailed) as e:
        Broadcaster(target, torch.nn.Linear(4, 4), rank=0, dtype=torch.float32)
    message = str(e.value.code)
    assert message.startswith("slurmrl: trainer: weight transfer (gloo): opening the transfer group")
    assert message.endswith(f"server(s) not answering: {dead}") and "\n" not in message, message
