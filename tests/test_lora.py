"""LoRA adapters hot-loaded into a real vLLM (CPU build) server started through slurmrl's runtime.

The adapter is built by hand (no peft): adapter_config.json + adapter_model.safetensors with
peft's tensor names, B nonzero so that the adapter changes the outputs. The served logprobs
with the adapter are checked against transformers on the base model with the LoRA merged in
(W + B @ A * alpha / r).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from live_components import LiveComponent, free_port_base, post_json, serve_recipe

from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
from slurmrl.runtime.vllm import client

pytestmark = pytest.mark.vllm

RANK, ALPHA = 8, 16
TARGETS = ("q_proj", "v_proj")
PROMPT = "lora check"


def build_adapter(out: Path, base: Path, seed: int = 1234, scale: float = 0.5) -> tuple[Path, dict]:
    """A rank-8 LoRA on q_proj/v_proj of every layer; returns its folder and {module: (A, B)}."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((base / "config.json").read_text())
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    out_dims = {
        "q_proj": cfg["num_attention_heads"] * cfg["head_dim"],
        "v_proj": cfg["num_key_value_heads"] * cfg["head_dim"],
    }
    gen = torch.Generator().manual_seed(seed)
    tensors, pairs = {}, {}
    for i in range(layers):
        for m in TARGETS:
            a = torch.randn(RANK, hidden, generator=gen) * scale
            b = torch.randn(out_dims[m], RANK, generator=gen) * scale
            key = f"base_model.model.model.layers.{i}.self_attn.{m}"
            tensors[f"{key}.lora_A.weight"] = a.contiguous()
            tensors[f"{key}.lora_B.weight"] = b.contiguous()
            pairs[f"model.layers.{i}.self_attn.{m}.weight"] = (a, b)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "target_modules": list(TARGETS), "base_model_name_or_path": str(base), "modules_to_save": None,
    }, indent=1))
    return out, pairs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from slurmrl.app.build import render

    tmp = tmp_path_factory.mktemp("lora")
    model = build_tiny(tmp / "model", seed=0)
    adapter, pairs = build_adapter(tmp / "adapter", model)
    recipe = tmp / "lora.toml"
    recipe.write_text(serve_recipe(model, name="lora", servers=1, max_lora_rank=8))
    out = render(recipe, run_dir=tmp / "run")
    base = free_port_base()
    server = LiveComponent(out.run_dir, "inference", base)
    url = f"http://127.0.0.1:{base + 16}"
    try:
        server.wait_http(f"{url}/health", timeout=600)
        yield {"url": url, "model": model, "adapter": adapter, "pairs": pairs}
    finally:
        server.stop()


def _served(url: str, model: str) -> tuple[list[int], list[float]]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}
    lp = post_json(f"{url}/v1/completions", body)["choices"][0]["logprobs"]
    return [int(t.split(":")[1]) for t in lp["tokens"]], lp["token_logprobs"]


def _reference(model_dir: Path, pairs: dict | None, completion_ids: list[int]) -> list[float]:
    """transformers logprobs of completion_ids after PROMPT, with the LoRA merged in if given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt_ids = AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    if pairs:
        state = model.state_dict()
        with torch.no_grad():
            for name, (a, b) in pairs.items():
                state[name].add_(b @ a * (ALPHA / RANK))
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    n = len(prompt_ids)
    return [logp[n - 1 + i, t].item() for i, t in enumerate(completion_ids)]


def test_lora_load_serve_unload(setup):
    url, model, adapter, pairs = setup["url"], setup["model"], setup["adapter"], setup["pairs"]
    base_ids, base_lp = _served(url, "tiny")
    assert base_lp == pytest.approx(_reference(model, None, base_ids), abs=2e-3)

    took = client.load_lora([url], "ad1", str(adapter))
    assert url in took
    models = [m["id"] for m in json.loads(_get(f"{url}/v1/models"))["data"]]
    assert "ad1" in models and "tiny" in models

    lora_ids, lora_lp = _served(url, "ad1")
    # the adapter changes the answer: other tokens, or the same tokens with other logprobs
    assert lora_ids != base_ids or max(abs(a - b) for a, b in zip(lora_lp, base_lp)) > 0.05
    # the base model is still served unchanged next to the adapter
    again_ids, again_lp = _served(url, "tiny")
    assert again_ids == base_ids and again_lp == pytest.approx(base_lp, abs=1e-4)
    # and the adapter's logprobs are those of the merged weights
    assert lora_lp == pytest.approx(_reference(model, pairs, lora_ids), abs=2e-3)
    assert max(abs(a - b) for a, b in zip(lora_lp, _reference(model, None, lora_ids))) > 0.05

    client.unload_lora([url], "ad1")
    with pytest.raises(Exception) as err:
        _served(url, "ad1")
    assert getattr(err.value, "code", None) in (400, 404), err.value
    with pytest.raises(client.VLLMError):
        client.unload_lora([url], "ad1")  # already gone
    assert _served(url, "tiny")[0] == base_ids


def test_load_lora_reports_a_bad_path(setup, tmp_path):
    with pytest.raises(client.VLLMError, match=setup["url"]):
        client.load_lora([setup["url"]], "missing", str(tmp_path / "no-such-adapter"))
    _served(setup["url"], "tiny")  # the server survives


def _get(url: str) -> bytes:
    import urllib.request

    from slurmrl import secret

    with urllib.request.urlopen(urllib.request.Request(url, headers=secret.headers()), timeout=10) as r:
        return r.read()
