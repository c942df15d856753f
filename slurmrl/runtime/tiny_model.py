"""A deterministic tiny causal LM and tokenizer, built locally (no hub), for tests and the demo.

Character-level tokenizer (every printable ASCII character is a token, plus chat-role tokens),
a 2-layer Llama with head_dim 64 (vLLM's CPU kernels need >= 64) and untied embeddings
(vLLM's weight reload skips a tied LM head). The same seed gives the same bytes.

    python -m slurmrl.runtime.tiny_model DIR [--seed N]
    python -m slurmrl.runtime.tiny_model DIR --no-weights     (for Dynamo's mocker: no torch needed)

``build_no_weights`` writes only what Dynamo's mocker reads (config.json, tokenizer.json,
tokenizer_config.json with the chat template) with a vocabulary of ``MOCKER_VOCAB`` tokens: the
mocker emits random token ids (seen in the 1000-2000 range), which must decode to text.
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


MOCKER_VOCAB = 4096


def build_no_weights(out: str | Path, vocab_size: int = MOCKER_VOCAB) -> Path:
    """A model folder without weights: the tokenizer above plus filler tokens ``w<i> `` up to
    ``vocab_size``, and a Llama-shaped config.json. Needs only the ``tokenizers`` library."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    v = vocab()
    v.update({f"w{i} ": i for i in range(len(v), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=v, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|end|>",
        "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE,
        "model_max_length": 4096,
    }, indent=1))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "bos_token_id": v["<s>"], "eos_token_id": v["<|end|>"], "pad_token_id": v["<pad>"],
        "torch_dtype": "float32", "tie_word_embeddings": False,
    }, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": v["<s>"], "eos_token_id": v["<|end|>"]}))
    return out


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
    ap.add_argument("--no-weights", action="store_true", help="config and tokenizer only (Dynamo's mocker)")
    args = ap.parse_args()
    print(build_no_weights(args.dir) if args.no_weights else build(args.dir, args.seed))


if __name__ == "__main__":
    main()
