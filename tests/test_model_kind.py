"""inference.return_routed_experts needs a mixture-of-experts model: a folder on this machine is judged
by its config.json (whatever it is called), a hub id by its name; a refusal is one line naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmrl.app.build import build
from slurmrl.errors import UserError
from slurmrl.plan import model_kind

RECIPE = """\
name = "replay"
kind = "inference"
[slurm]
gpus_per_node = 8
cpus_per_node = 64
[model]
path = {path}
[inference]
return_routed_experts = true
"""
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 128,
             "num_experts_per_tok": 8}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576}


def model_dir(root: Path, name: str, config: dict) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def built(tmp_path: Path, path: str):
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.format(path=json.dumps(path)))
    return build(recipe, run_dir=tmp_path / "run")


def test_a_local_moe_folder_with_a_plain_name_is_accepted(tmp_path):
    folder = model_dir(tmp_path, "my-finetune", QWEN3_MOE)
    out = built(tmp_path, str(folder))
    assert "--enable-return-routed-experts" in out.script


def test_a_local_dense_folder_is_refused_even_when_its_name_says_moe(tmp_path):
    folder = model_dir(tmp_path, "Qwen3-30B-A3B-MoE", LLAMA)
    with pytest.raises(UserError) as e:
        built(tmp_path, str(folder))
    assert e.value.field == "inference.return_routed_experts"
    assert "config.json" in e.value.message and "num_experts" in e.value.message
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize("config", [
    {"num_local_experts": 8},  # Mixtral
    {"n_routed_experts": 256},  # DeepSeek-V3
    {"architectures": ["OlmoeForCausalLM"]},
    {"text_config": {"num_local_experts": 16}},  # Llama-4: the language model's config
])
def test_each_way_a_config_counts_experts(config):
    assert model_kind.experts_in(config)


@pytest.mark.parametrize("config", [LLAMA, {"num_experts": 0}, {"num_experts": True}, {"num_experts": "8"}, {}])
def test_a_config_without_experts(config):
    assert not model_kind.experts_in(config)


def test_hub_ids_are_judged_by_their_name(tmp_path):
    assert "--enable-return-routed-experts" in built(tmp_path, "Qwen/Qwen3-30B-A3B").script
    with pytest.raises(UserError) as e:
        built(tmp_path, "Qwen/Qwen3-4B")
    assert e.value.field == "inference.return_routed_experts" and "name" in e.value.message


def test_a_config_that_is_not_json_is_one_line_naming_the_model(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    with pytest.raises(UserError) as e:
        built(tmp_path, str(folder))
    assert e.value.field == "model.path" and "\n" not in str(e.value)


@pytest.mark.parametrize("hub_id", ["zai-org/GLM-4.5-Air", "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3",
                                    "mistralai/Mixtral-8x7B-v0.1", "allenai/OLMoE-1B-7B-0924", "Qwen/Qwen1.5-MoE-A2.7B"])
def test_hub_ids_of_the_families_replay_reproduces_are_accepted(tmp_path, hub_id):
    assert "--enable-return-routed-experts" in built(tmp_path, hub_id).script


@pytest.mark.parametrize("hub_id", ["openai/gpt-oss-20b", "ai21labs/Jamba-v0.1", "meta-llama/Llama-4-Scout-17B-16E",
                                    "MiniMaxAI/MiniMax-M2"])
def test_a_moe_hub_id_whose_router_replay_cannot_reproduce_is_refused(tmp_path, hub_id):
    with pytest.raises(UserError) as e:
        built(tmp_path, hub_id)
    assert e.value.field == "inference.return_routed_experts" and "\n" not in str(e.value)
    assert "exactly" in e.value.message and "GLM-4-MoE" in e.value.message


def test_a_local_moe_folder_of_another_router_family_is_refused_by_its_model_type(tmp_path):
    folder = model_dir(tmp_path, "Qwen3-30B-A3B", {"model_type": "gpt_oss", "num_local_experts": 32})
    with pytest.raises(UserError) as e:
        built(tmp_path, str(folder))
    assert e.value.field == "inference.return_routed_experts" and "'gpt_oss'" in e.value.message
    glm = model_dir(tmp_path, "plain-name", {"model_type": "glm4_moe", "n_routed_experts": 128})
    assert "--enable-return-routed-experts" in built(tmp_path, str(glm)).script
