"""[inference] of a recipe vLLM serves: what the vLLM engine's modules read (its servers, their
placement, the Mooncake store)."""

from __future__ import annotations

from slurmrl.plan.context import Context
from slurmrl.recipe.vllm import VllmInference


def section(ctx: Context) -> VllmInference:
    """``[inference]``, the vLLM engine's section (the engine builds only for backend ``vllm``)."""
    assert isinstance(ctx.r.inference, VllmInference), "built only for [inference] with backend 'vllm'"
    return ctx.r.inference
