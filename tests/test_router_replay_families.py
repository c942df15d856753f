"""Router replay is exact for every router family it accepts: replaying the experts a model's routers
picked themselves leaves the logits (and the loss's gradients) equal to the model's own forward, over
random tiny models of each family (hypothesis: experts, top-k, norm_topk_prob, groups, the GLM/DeepSeek
correction bias and scaling factor). Replaying other experts changes them (the check can fail)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from moe_families import FAMILIES, SIGMOID, config  # noqa: E402

from slurmrl.plan import model_kind  # noqa: E402
from slurmrl.runtime.trainer import router_replay  # noqa: E402


@st.composite
def shapes(draw, family: str):
    experts = draw(st.sampled_from([4, 8, 16]))
    knobs = dict(experts=experts, top_k=draw(st.integers(1, 4)), norm=draw(st.booleans()))
    if family in SIGMOID:
        groups = draw(st.sampled_from([g for g in (1, 2, 4) if experts // g >= 2]))
        topk_groups = draw(st.integers(1, groups))
        knobs["top_k"] = min(knobs["top_k"], topk_groups * experts // groups)
        knobs.update(groups=groups, topk_groups=topk_groups, scale=draw(st.floats(0.5, 3.0)))
    return knobs


def own_and_replayed(model, ids):
    """Logits of the model's own forward, the experts its routers chose, and logits replaying them."""
    seen = []
    hooks = [r.register_forward_hook(lambda _m, _i, out: seen.append(out[2].clone()))
             for r in router_replay.routers(model)]
    own = model(ids).logits
    for h in hooks:
        h.remove()
    experts = torch.stack(seen, dim=1)
    with router_replay.replay(model, experts):
        replayed = model(ids).logits
    return own, experts, replayed


def tiny(family: str, seed: int, **knobs):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(family, **knobs)).eval()
    for r in router_replay.routers(model):
        if hasattr(r, "e_score_correction_bias"):  # a trained bias: it changes the choice, not the weights
            r.e_score_correction_bias.copy_(torch.randn(r.e_score_correction_bias.shape) * 0.5)
    return model


@pytest.mark.slow  # 12 random models x 7 families, three forwards and two backwards each: ~80 s
@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_replaying_the_models_own_routing_changes_nothing(family, data):
    knobs = data.draw(shapes(family))
    seed = data.draw(st.integers(0, 2**16))
    model = tiny(family, seed, **knobs)
    assert type(router_replay.routers(model)[0]).__name__ in router_replay.SCORING
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(seed))
    own, _, replayed = own_and_replayed(model, ids)
    assert torch.allclose(own, replayed, rtol=0, atol=1e-6), (own - replayed).abs().max()
    # and the gradients of a loss through the replayed routing equal the model's own
    model.zero_grad()
    model(ids).logits.float().logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    _, experts, _ = own_and_replayed(model, ids)
    with router_replay.replay(model, experts):
        model(ids).logits.float().logsumexp(-1).sum().backward()
    for n, p in model.named_parameters():
        if n in grads:
            assert torch.allclose(p.grad, grads[n], rtol=1e-5, atol=1e-6), n


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_replaying_other_experts_changes_the_logits(family):
    model = tiny(family, 1, experts=8, top_k=2)
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    own, experts, _ = own_and_replayed(model, ids)
    with torch.no_grad(), router_replay.replay(model, (experts + 1) % 8):
        other = model(ids).logits
    assert (own - other).abs().max() > 1e-4


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_planner_accepts_each_family_the_trainer_replays(family):
    assert family in model_kind.REPLAY_FAMILIES


def test_a_router_replay_cannot_reproduce_is_named():
    class OddRouter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.top_k, self.weight = 2, torch.nn.Parameter(torch.zeros(4, 8))

    model = torch.nn.Sequential(OddRouter())
    assert router_replay.is_moe(model)
    with pytest.raises(ValueError, match="cannot reproduce OddRouter"):
        with router_replay.replay(model, torch.zeros(3, 1, 2, dtype=torch.int64)):
            pass
