"""A LoRA policy (``[trainer.lora]``): what it needs from the rest of the recipe.

The trainer publishes adapters that every vLLM server hot-loads (``--enable-lora --max-lora-rank
N``, runtime updates allowed), so the servers' ``inference.max_lora_rank`` must hold the adapter's
rank: a smaller one is refused, and a missing one becomes the smallest rank vLLM accepts that
holds it (what the script then shows on the servers' command lines).
"""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.vllm import VLLM_LORA_RANKS, VllmInference


def check(r: Recipe) -> None:
    t = r.trainer
    if t is None or t.lora is None:
        return
    if r.kind != "rl":
        raise UserError("trainer.lora", f"only applies to kind 'rl' (a LoRA policy whose adapter the inference "
                        f"servers hot-load); kind {r.kind!r} trains the full weights")
    if not isinstance(r.inference, VllmInference):  # another engine refuses kind rl (its own check)
        return
    if r.inference.mode == "pd":
        raise UserError("trainer.lora", "a LoRA policy with prefill/decode disaggregation is not supported: the KV "
                        "cache a prefill server computes under the adapter would have to reach decode servers that "
                        "load the same adapter at the same step, which slurmrl does not coordinate; use inference "
                        "mode 'replicas'")
    have = r.inference.max_lora_rank
    if have is not None and have < t.lora.rank:
        raise UserError("trainer.lora.rank", f"{t.lora.rank} is more than inference.max_lora_rank ({have}), the "
                        "largest adapter the servers load; raise max_lora_rank or leave it out (then it is set "
                        "from the rank)")


def server_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``."""
    return next(v for v in VLLM_LORA_RANKS if v >= rank)


def apply(r: Recipe) -> Recipe:
    """``r`` with inference.max_lora_rank set from trainer.lora.rank where the recipe leaves it out."""
    t = r.trainer
    if t is None or t.lora is None or not isinstance(r.inference, VllmInference) or r.inference.max_lora_rank is not None:
        return r
    inf = r.inference.model_copy(update={"max_lora_rank": server_rank(t.lora.rank)})
    return r.model_copy(update={"inference": inf})
