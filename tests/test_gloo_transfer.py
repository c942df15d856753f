"""The gloo weight-transfer engine, both sides in one process over a real gloo group on loopback:
the trainer's engine casts and packs the model into buckets (into two buffers it keeps from sync to
sync) and the worker's engine unpacks them into views and hands them to ``load_weights``. Buckets
smaller than the model (and one tensor larger than a bucket) make several of them per sync; two
syncs of changed weights check that a reused buffer never overwrites what the worker still holds.

Test doubles (no vLLM server here; tests/test_inference_vllm.py runs the engine in real servers):
``Receiver`` stands for a vLLM model's ``load_weights`` and keeps the views it is given until the
end of the sync, as vLLM's layerwise reload keeps a layer's views until the layer is complete;
``LoopbackClient`` stands for the HTTP client, calling the worker's engine directly."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytestmark = pytest.mark.slow  # vLLM's import


class Receiver:
    """Test double of a vLLM model: keeps the (name, view) pairs it was given."""

    def __init__(self):
        self.held: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights):
        self.held.extend(weights)


class LoopbackClient:
    """Test double of ``WeightSync``: the four phases go straight to the worker's engine."""

    def __init__(self, worker):
        self.worker = worker

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.worker.init_transfer_engine(self.worker.parse_init_info({**init_info, "rank_offset": 1}))

    def start_weight_update(self) -> None:
        self.worker.model.held.clear()

    def update_weights(self, update_info: dict) -> None:
        self.worker.update_weights(update_info)

    def finish_weight_update(self, weight_version=None) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["model", "snapshot"])
def test_buckets_reach_the_worker_intact_sync_after_sync(kind):
    """From the model itself, or (as the trainer sends) from its snapshot, itself in buckets of
    its own size (snapshot.Snapshot, weight_sync.SnapshotSource)."""
    from slurmrl.runtime.trainer.snapshot import Layout, Snapshot
    from slurmrl.runtime.trainer.weight_sync import ModelSource, SnapshotSource
    from slurmrl.runtime.vllm.gloo_transfer import (
        GlooTrainerInitInfo,
        GlooTrainerWeightTransferEngine,
        GlooWeightTransferEngine,
    )

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(300, 16), torch.nn.Linear(16, 40), torch.nn.LayerNorm(40),
                                torch.nn.Linear(40, 300))  # 4800 + 640 + 40 + 80 + 80 + 12000 + 300 parameters
    config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_index=0, world_size=1, rank=0),
                             model_config=None)
    worker = GlooWeightTransferEngine(None, config, torch.device("cpu"), Receiver())
    bucket = 4096  # bytes: 2048 bf16 values, so the 12000-value weight goes alone and the rest in several
    info = GlooTrainerInitInfo(master_address="127.0.0.1", master_port=free_port(), world_size=2,
                               bucket_bytes=bucket, timeout_s=30, rank=0)
    snapshot = Snapshot(model, Layout(model, 0, 1, bucket_bytes=3000, dtype=torch.bfloat16))
    source = (ModelSource(model, torch.bfloat16, cast_in_engine=True) if kind == "model"
              else SnapshotSource(snapshot))
    sender = GlooTrainerWeightTransferEngine.trainer_init(info, client=LoopbackClient(worker), source=source)
    try:
        for step in range(2):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))
            snapshot.take()  # what the trainer does when a step ends
            sender.send_weights()
            got = dict(worker.model.held)
            expected = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
            assert list(got) == list(expected), step
            for name, tensor in expected.items():
                assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], tensor), (step, name)
        assert len(sender.buffers) == 2  # the trainer's two buffers, kept from the first sync to the second
    finally:
        sender.shutdown()
        worker.shutdown()
