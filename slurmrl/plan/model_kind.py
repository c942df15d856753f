"""Is ``model.path`` a mixture-of-experts model? From its ``config.json`` where the folder is on this
machine (read with ``json``: plan imports no transformers), else from its name (a hub id, or a path
only the cluster sees).

This is the one file plan reads besides the recipe: router replay (``inference.return_routed_experts``)
needs experts, and a local folder's name need not say so (``/models/my-finetune`` may be a Qwen3-MoE).
"""

from __future__ import annotations

import re
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.read import read_json
from slurmrl.settings.mesh import EXPERT_FIELDS, SUB_CONFIGS

# what a hub id (or a folder named after one) of a mixture-of-experts model says in its name
MOE_NAME = re.compile(r"moe|mixtral|-a\d+(\.\d+)?b\b|deepseek-(v[23]|r1)|qwen3-next|gpt-oss|jamba|dbrx|arctic|"
                      r"glm-4\.[56]|kimi-k2|minimax-m|llama-4|ernie-4\.5", re.I)
# config.json model_type -> its router family: the trainer's router replay reproduces these routers
# exactly (runtime/trainer/router_replay.py SCORING; a property test per family)
REPLAY_FAMILIES = {"qwen2_moe": "Qwen2-MoE", "qwen3_moe": "Qwen3-MoE", "olmoe": "OLMoE", "mixtral": "Mixtral",
                   "glm4_moe": "GLM-4-MoE", "deepseek_v3": "DeepSeek-V3", "dots1": "dots.llm1"}
# a hub id's name that says which of those families it is
REPLAY_NAME = re.compile(r"qwen1\.5-moe|qwen2-57b-a14b|qwen3-\d+(\.\d+)?b-a\d+b|qwen3-coder-\d+b-a\d+b|mixtral|olmoe|"
                         r"glm-4\.[56](-air)?\b(?!v)|deepseek-(v3|r1)|dots\.llm1", re.I)


def config_of(path: str) -> dict | None:
    """``path/config.json`` as a dict; None where there is no such file here (a hub id)."""
    file = Path(path).expanduser() / "config.json"
    try:
        config = read_json(file, missing=None)
    except UserError as e:
        raise UserError("model.path", f"cannot read {str(file)!r} as JSON: {e.message}") from None
    if config is None:
        return None
    if not isinstance(config, dict):
        raise UserError("model.path", f"{str(file)!r} is not a JSON object")
    return config


def experts_in(config: dict) -> bool:
    """A routed-expert count > 0, or an architecture naming MoE, here or in a sub-config."""
    for c in [config] + [config[k] for k in SUB_CONFIGS if isinstance(config.get(k), dict)]:
        if any(isinstance(c.get(f), int) and not isinstance(c.get(f), bool) and c[f] > 0 for f in EXPERT_FIELDS):
            return True
        archs = c.get("architectures")
        if isinstance(archs, list) and any(isinstance(a, str) and "moe" in a.lower() for a in archs):
            return True
    return False


def check_moe(path: str, field: str, why: str = "there are no experts to replay") -> None:
    """``field`` needs a mixture-of-experts model at ``path``: one line naming it where there is none."""
    config = config_of(path)
    if config is None:
        if not MOE_NAME.search(path):
            raise UserError(field, f"{path!r} does not name a mixture-of-experts model (no MoE, -A3B, Mixtral, "
                            f"DeepSeek-V3, ... in its name, and no config.json there): {why}")
    elif not experts_in(config):
        raise UserError(field, f"{path!r} is not a mixture-of-experts model (its config.json has no "
                        f"{', '.join(EXPERT_FIELDS)} > 0 and no MoE architecture): {why}")


def check_replay(path: str, field: str) -> None:
    """Router replay needs experts at ``path`` and a router family the trainer reproduces exactly."""
    check_moe(path, field)
    config = config_of(path)
    families = ", ".join(REPLAY_FAMILIES.values())
    if config is None:
        if not REPLAY_NAME.search(path):
            raise UserError(field, f"{path!r} does not name a model whose router the trainer replays exactly "
                            f"({families}); give a local folder with its config.json, or set {field} = false")
        return
    kind = config.get("model_type")
    if kind not in REPLAY_FAMILIES:
        raise UserError(field, f"the trainer cannot replay the routing of {path!r} exactly (model_type "
                        f"{kind!r}; it replays {families}); set {field} = false")
