"""The shape numbers plan checks a mesh against, for well-known hub ids whose ``config.json`` is not on
the planning machine (a hub id is downloaded by the job, not by ``plan``).

Each entry is the part of that model's published ``config.json`` the mesh rules read: routed experts
(``num_experts`` or its family's name for it), attention heads and KV heads. A name matches on the
repository part of the id (``Qwen/Qwen3-30B-A3B`` and ``/models/Qwen3-30B-A3B-Instruct-2507`` alike:
fine-tunes keep the base model's shape), longest key first. For an id not listed here plan knows no
numbers: ``ep`` is taken with one warning line (``plan/mesh.py``), and the trainer checks the model's
experts and heads against the mesh when it loads it (the same rules: ``settings/mesh.py``).
"""

from __future__ import annotations

import re

# repository-name prefix (lower case) -> the config.json fields the mesh checks
KNOWN: dict[str, dict[str, int]] = {
    "qwen3-30b-a3b": {"num_experts": 128, "num_attention_heads": 32, "num_key_value_heads": 4},
    "qwen3-coder-30b-a3b": {"num_experts": 128, "num_attention_heads": 32, "num_key_value_heads": 4},
    "qwen3-235b-a22b": {"num_experts": 128, "num_attention_heads": 64, "num_key_value_heads": 4},
    "qwen1.5-moe-a2.7b": {"num_experts": 60, "num_attention_heads": 16, "num_key_value_heads": 16},
    "mixtral-8x7b": {"num_local_experts": 8, "num_attention_heads": 32, "num_key_value_heads": 8},
    "mixtral-8x22b": {"num_local_experts": 8, "num_attention_heads": 48, "num_key_value_heads": 8},
    "olmoe-1b-7b": {"num_experts": 64, "num_attention_heads": 16, "num_key_value_heads": 16},
    "glm-4.5-air": {"n_routed_experts": 128, "num_attention_heads": 96, "num_key_value_heads": 8},
    "glm-4.5": {"n_routed_experts": 160, "num_attention_heads": 96, "num_key_value_heads": 8},
    "deepseek-v3": {"n_routed_experts": 256, "num_attention_heads": 128, "num_key_value_heads": 128},
    "deepseek-r1": {"n_routed_experts": 256, "num_attention_heads": 128, "num_key_value_heads": 128},
    "gpt-oss-20b": {"num_local_experts": 32, "num_attention_heads": 64, "num_key_value_heads": 8},
    "gpt-oss-120b": {"num_local_experts": 128, "num_attention_heads": 64, "num_key_value_heads": 8},
}
_ORDER = sorted(KNOWN, key=len, reverse=True)  # "glm-4.5-air" before "glm-4.5"


def known(path: str) -> dict[str, int] | None:
    """The listed shape of the model ``path`` names (a hub id or a folder named after one), else None."""
    name = re.split(r"[/\\]", path.rstrip("/\\"))[-1].lower()
    for key in _ORDER:
        if name.startswith(key) and not name[len(key):len(key) + 1].isalnum():
            return dict(KNOWN[key])
    return None
