"""Token log-probabilities, the SFT loss and the PPO-clip policy loss (GRPO-style).

Every loss here returns a *sum* over target tokens; the caller divides by the number of target
tokens in the whole global batch, so the step's loss is a mean over tokens whatever the split
into micro-batches and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets) under logits ([..., V]), in float32."""
    logits = logits.float()
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The entropy of softmax(logits) at each masked position, float32 [N]."""
    sel = logits[mask].float()
    logp = torch.log_softmax(sel, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@torch.no_grad()
def entropy_sum(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over masked positions of the entropy of softmax(logits)."""
    return token_entropy(logits, mask).sum()


def shifted(logits: torch.Tensor, input_ids: torch.Tensor):
    """Logits at t-1 and the token at t, for t >= 1."""
    return logits[:, :-1], input_ids[:, 1:]


def sft_loss_sum(logits: torch.Tensor, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over target tokens. ``targets[b, t]``: token t is a loss target."""
    lg, nxt = shifted(logits, input_ids)
    mask = targets[:, 1:]
    lp = token_logprobs(lg[mask], nxt[mask])
    return -lp.sum()


@dataclass(frozen=True)
class PolicyLoss:
    """The RL objective's knobs, read once from the trainer's settings.

    ``clip_low``/``clip_high``: ratios outside ``[1 - clip_low, 1 + clip_high]`` are clipped (PPO;
    DAPO's clip-higher when ``clip_high > clip_low``). ``mask_low``/``mask_high``: a token whose ratio
    lies outside ``[mask_low, mask_high]`` is left out of the loss altogether (masked importance
    sampling, as prime-rl's token mask: the trainer's and the inference engine's probabilities of
    that token disagree too much to learn from it); None: no mask on that side.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    mask_low: float | None = None
    mask_high: float | None = None
    kl_coef: float = 0.0

    @classmethod
    def of(cls, s) -> PolicyLoss:
        """From ``TrainerSettings`` (``clip_eps_high`` unset: the symmetric ``clip_eps``)."""
        high = s.clip_eps if s.clip_eps_high is None else s.clip_eps_high
        return cls(s.clip_eps, high, s.token_mask_low, s.token_mask_high, s.kl_coef)


def ppo_clip_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss: PolicyLoss,
    ref_logp: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """PPO clipped objective per token, summed over ``mask``.

    ratio = exp(logp - old_logp) (old = the inference engine's logprob of the sampled token);
    loss_t = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) + kl_coef * k3(ref || new),
    k3 = exp(ref - new) - (ref - new) - 1, over the tokens ``mask`` keeps and the ratio mask keeps.
    ``advantages`` broadcasts over tokens. ``clip`` counts tokens outside the clip range, ``masked``
    the tokens the ratio mask dropped (both among ``mask``).
    """
    m = mask.float()
    old = torch.where(torch.isnan(old_logp), logp.detach(), old_logp)  # no inference logprob: ratio 1
    log_ratio = (logp - old).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - loss.clip_low, 1.0 + loss.clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    r = ratio.detach()
    outside = (r < 1.0 - loss.clip_low) | (r > 1.0 + loss.clip_high)
    dropped = torch.zeros_like(r, dtype=torch.bool)
    if loss.mask_low is not None:
        dropped |= r < loss.mask_low
    if loss.mask_high is not None:
        dropped |= r > loss.mask_high
    out = {
        "clip": (outside.float() * m).sum(),
        "masked": (dropped.float() * m).sum(),
        "ratio": (r * m).sum(),
    }
    if ref_logp is not None:
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        kl = torch.exp(d) - d - 1.0
        out["kl"] = (kl.detach() * m).sum()
        if loss.kl_coef > 0:
            per_token = per_token + loss.kl_coef * kl
    out["loss"] = (per_token * m * (~dropped).float()).sum()
    return out
