"""A deterministic tiny causal LM and tokenizer, built locally (no hub), for tests and the demo.

Character-level tokenizer (every printable ASCII character is a token, plus chat-role tokens),
a 2-layer Llama with head_dim 64 (vLLM's CPU kernels need >= 64) and untied embeddings
(vLLM's weight reload skips a tied LM head). The same seed gives the same bytes.

    python -m slurmrl.runtime.tiny_model DIR [--seed N]
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def vocab() -> dict[str, int]:
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    return {tok: i for i, tok in enumerate(SPECIALS + chars)}


def build_tokenizer(out: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|end|>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=SPECIALS[4:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build(out: str | Path, seed: int = 0, hidden: int = 128, layers: int = 2) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    config = LlamaConfig(
        vocab_size=len(vocab()), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, head_dim=64,
        max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "slurmrl-tiny.json").write_text(json.dumps({"seed": seed, "hidden": hidden, "layers": layers}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(build(args.dir, args.seed))


if __name__ == "__main__":
    main()
