"""Router replay: the trainer's MoE layers route each sampled token to the experts vLLM used for it.

With ``inference.return_routed_experts`` vLLM returns, per sample, the experts every token was
routed to in every MoE layer (``routed_experts``: base64 ``.npy`` of shape ``(tokens - 1, layers,
top_k)``, prompt and completion, the last sampled token never forwarded). The orchestrator keeps
them with the sample (``decode``); the packed row carries them per token (-1 where none was
recorded); and while ``replay(model, experts)`` is open, every router of the model (transformers'
Qwen3-MoE ``Qwen3MoeTopKRouter`` and any router of the same shape: ``top_k``, ``num_experts``,
``norm_topk_prob``, returning ``(logits, scores, indices)``) keeps its own logits but takes the
recorded experts instead of its top-k for the tokens that have them. The weights of those experts
are the router's own probabilities at them (renormalised as the router does), so the router still
gets gradients. Without replay a near tie flips the trainer's top-k away from what inference
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


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers, in layer order."""
    return [m for m in model.modules()
            if all(hasattr(m, a) for a in ("top_k", "num_experts", "norm_topk_prob")) and hasattr(m, "weight")]


def is_moe(model: torch.nn.Module) -> bool:
    return bool(routers(model))


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


def _replayed(router: torch.nn.Module, chosen: torch.Tensor):
    """A forward hook: the router's own outputs, with ``chosen`` ([tokens, top_k], -1: none) in place
    of its top-k where recorded."""

    def hook(_module, _inputs, output):
        logits, scores, indices = output
        have = (chosen >= 0).all(dim=-1).to(indices.device)
        if not bool(have.any()):
            return output
        idx = torch.where(have[:, None], chosen.to(indices.device), indices)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights = probs.gather(-1, idx)
        if router.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
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
