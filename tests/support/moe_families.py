"""Tiny random models of every MoE family whose router replay claims to be exact (a test helper):
``config(family, **knobs)`` -> a transformers config small enough to build in milliseconds."""

from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=256,
                              tie_word_embeddings=False)
DEEPSEEK_MLA: dict[str, Any] = dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
                                    v_head_dim=8, head_dim=4, first_k_dense_replace=0, n_shared_experts=1)
# family (config.json model_type) -> how it names its expert count, and what else it needs
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2_moe": ("num_experts", dict(moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                      decoder_sparse_step=1, mlp_only_layers=[])),
    "qwen3_moe": ("num_experts", dict(moe_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[])),
    "mixtral": ("num_local_experts", {}),
    "olmoe": ("num_experts", {}),
    "glm4_moe": ("n_routed_experts", dict(moe_intermediate_size=16, first_k_dense_replace=0, n_shared_experts=1)),
    "deepseek_v3": ("n_routed_experts", dict(moe_intermediate_size=16, **DEEPSEEK_MLA)),
    "dots1": ("n_routed_experts", dict(moe_intermediate_size=16, first_k_dense_replace=0, n_shared_experts=1)),
}
SIGMOID = {"glm4_moe", "deepseek_v3", "dots1"}  # sigmoid + bias + group-limited top-k + scaling factor


def config(family: str, experts: int = 8, top_k: int = 2, norm: bool = True, groups: int = 1, topk_groups: int = 1,
           scale: float = 1.0, layers: int = 2):
    from transformers import AutoConfig

    count, extra = FAMILIES[family]
    kw: dict[str, Any] = dict(COMMON, **extra, num_hidden_layers=layers, num_experts_per_tok=top_k)
    kw[count] = experts
    if family != "mixtral":
        kw["norm_topk_prob"] = norm
    if family in SIGMOID:
        kw.update(n_group=groups, topk_group=topk_groups, routed_scaling_factor=scale)
    return AutoConfig.for_model(family, **kw)
