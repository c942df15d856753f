"""Router replay: the trainer's MoE layers route each sampled token to the experts vLLM used for it.

With ``inference.return_routed_experts`` vLLM returns, per sample, the experts every token was
routed to in every MoE layer (``routed_experts``: base64 ``.npy`` of shape ``(tokens - 1, layers,
top_k)``, prompt and completion, the last sampled token never forwarded). The orchestrator keeps
them with the sample (``decode``); the packed row carries them per token (-1 where none was
recorded); and while ``replay(model, experts)`` is open, every router of the model keeps its own
logits but takes the recorded experts instead of its top-k for the tokens that have them.

The weights of those experts come from the router's own scoring function (``SCORING``, by router
class), so replaying the experts a router picked itself changes nothing (a property test per family
checks logits equal) and the router still gets gradients:
- ``softmax`` (Qwen2-MoE, Qwen3-MoE, OLMoE, Mixtral): softmax of the logits in float32, gathered at
  the experts, renormalised where the router does (``norm_topk_prob``; Mixtral always), cast back;
- ``sigmoid`` (GLM-4-MoE, DeepSeek-V3, dots.llm1): sigmoid of the float32 logits, gathered at the
  experts, renormalised (+1e-20) where ``norm_topk_prob``, times ``routed_scaling_factor``. The
  ``e_score_correction_bias`` and the group-limited top-k only choose experts: the recorded ids
  replace that choice.
A router of any other class is refused (``routers`` raises, naming it) rather than replayed wrong;
the planner refuses the same families by ``config.json``'s ``model_type`` (plan/model_kind.py).
Without replay a near tie flips the trainer's top-k away from what inference
sampled with, and the importance ratio compares two different networks.

The hooks stay on until the ``with`` block ends: open it around the forward *and* the backward, so
activation recompute in the backward routes as the forward did.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def decode(routed_experts: str) -> list[list[list[int]]]:
    """vLLM's ``routed_experts`` (base64 ``.npy``) -> nested lists ``[token][layer][k]``."""
    return np.load(io.BytesIO(base64.b64decode(routed_experts)), allow_pickle=False).astype(np.int64).tolist()


SCORING: dict[str, tuple[str, str]] = {
    "Qwen2MoeTopKRouter": ("softmax", "attr"),
    "Qwen3MoeTopKRouter": ("softmax", "attr"),
    "OlmoeTopKRouter": ("softmax", "attr"),
    "MixtralTopKRouter": ("softmax", "always"),
    "Glm4MoeTopkRouter": ("sigmoid", "attr"),
    "DeepseekV3TopkRouter": ("sigmoid", "attr"),
    "Dots1TopkRouter": ("sigmoid", "attr"),
}


def _looks_like_router(m: torch.nn.Module) -> bool:
    name = type(m).__name__
    return hasattr(m, "top_k") and hasattr(m, "weight") and ("Router" in name or "Gate" in name)


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers, in layer order; ValueError naming a router class replay cannot reproduce."""
    found = [m for m in model.modules() if _looks_like_router(m)]
    unknown = sorted({type(m).__name__ for m in found if type(m).__name__ not in SCORING})
    if unknown:
        raise ValueError(f"router replay cannot reproduce {', '.join(unknown)}'s routing (it replays "
                         f"{', '.join(sorted(SCORING))})")
    return found


def is_moe(model: torch.nn.Module) -> bool:
    return any(_looks_like_router(m) for m in model.modules())


def per_token(samples_experts: list[list | None], lengths: list[int], layers: int, top_k: int) -> torch.Tensor:
    """One ``[tokens, layers, top_k]`` int64 tensor for documents laid end to end (``lengths``):
    each document's recorded rows first, -1 for its tokens without any."""
    out = torch.full((sum(lengths), layers, top_k), -1, dtype=torch.int64)
    at = 0
    for rec, n in zip(samples_experts, lengths):
        if rec:
            t = torch.as_tensor(rec, dtype=torch.int64)[:n]
            if tuple(t.shape[1:]) != (layers, top_k):
                raise ValueError(f"recorded experts have shape {tuple(t.shape)}, the model routes "
                                 f"{layers} layers x top {top_k}")
            out[at : at + t.shape[0]] = t
        at += n
    return out


def weights_at(router: torch.nn.Module, logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The router's own weights for experts ``idx`` ([tokens, top_k]) from its ``logits``, in float32."""
    scoring, norm = SCORING[type(router).__name__]
    renorm = norm == "always" or bool(router.norm_topk_prob)
    if scoring == "softmax":
        w = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, idx)
        return w / w.sum(dim=-1, keepdim=True) if renorm else w
    w = logits.float().sigmoid().gather(1, idx)
    if renorm:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.routed_scaling_factor


def _replayed(router: torch.nn.Module, chosen: torch.Tensor):
    """A forward hook: the router's own outputs, with ``chosen`` ([tokens, top_k], -1: none) in place
    of its top-k where recorded."""

    def hook(_module, _inputs, output):
        logits, scores, indices = output
        have = (chosen >= 0).all(dim=-1).to(indices.device)
        if not bool(have.any()):
            return output
        idx = torch.where(have[:, None], chosen.to(indices.device), indices)
        weights = weights_at(router, logits, idx)
        return logits, torch.where(have[:, None], weights.to(scores.dtype), scores), idx

    return hook


@contextmanager
def replay(model: torch.nn.Module, experts: torch.Tensor | None) -> Iterator[None]:
    """Route with ``experts`` ([tokens, layers, top_k] for the forward's flattened tokens, -1 where
    none) while open; ``None``: route as the model does."""
    if experts is None:
        yield
        return
    found = routers(model)
    if experts.shape[1] != len(found):
        raise ValueError(f"recorded experts for {experts.shape[1]} MoE layers, the model has {len(found)}")
    handles = [r.register_forward_hook(_replayed(r, experts[:, i])) for i, r in enumerate(found)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
