"""SFT data: JSONL -> token ids with a loss mask -> packed sequences, in a seeded order.

Each line is ``{"prompt": ..., "completion": ...}`` (text concatenated, EOS appended; loss on the
completion and EOS) or ``{"messages": [...]}`` (the tokenizer's chat template; loss on the
assistant turns as the template renders them). Which tokens are loss tokens is decided by
character spans and the tokenizer's offset mapping, so BPE merges at a boundary cannot shift it.

Packing: examples in the epoch's order (a permutation seeded by ``seed`` and the epoch) are
laid end to end into sequences of ``seq_len``; an example that does not fit starts the next
sequence (one longer than ``seq_len`` is cut). Position ids restart at 0 for every example: RoPE
positions stay right, and they mark where each example starts, which is what keeps attention
within an example (``packing.pack_sft`` -> ``doc_attention``, no mask built). A token is a loss target only when it is marked and its predecessor
belongs to the same example. The position in the data is (epoch, index of the next pack).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is a training target


def _spans_to_example(tok, text: str, spans: list[tuple[int, int]], add_special: bool) -> Example:
    enc = tok(text, add_special_tokens=add_special, return_offsets_mapping=True)
    ids, mask = list(enc["input_ids"]), []
    for start, end in enc["offset_mapping"]:
        mask.append(int(end > start and any(a <= start < b for a, b in spans)))
    return Example(ids, mask)


def encode(tok, row: dict) -> Example:
    if "messages" in row:
        msgs = row["messages"]
        full = tok.apply_chat_template(msgs, tokenize=False)
        spans = []
        for i, m in enumerate(msgs):
            if m.get("role") != "assistant":
                continue
            before = tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True) if i else ""
            upto = tok.apply_chat_template(msgs[: i + 1], tokenize=False)
            if not full.startswith(upto):  # a template that rewrites earlier turns: keep what agrees
                upto = upto[: next((k for k, (a, b) in enumerate(zip(upto, full)) if a != b), len(upto))]
            if not upto.startswith(before):
                before = ""
            spans.append((len(before), len(upto)))
        return _spans_to_example(tok, full, spans, add_special=False)
    if "prompt" in row and "completion" in row:
        text = row["prompt"] + row["completion"]
        ex = _spans_to_example(tok, text, [(len(row["prompt"]), len(text))], add_special=True)
        if tok.eos_token_id is not None:
            ex.ids.append(tok.eos_token_id)
            ex.mask.append(1)
        return ex
    raise ValueError(f"an SFT line needs prompt/completion or messages, got keys {sorted(row)}")


def load_jsonl(path: str | Path, tok) -> list[Example]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(encode(tok, json.loads(line)))
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"slurmrl: trainer: {path}:{n}: {e}") from None
    if not out:
        raise SystemExit(f"slurmrl: trainer: {path}: no examples")
    return out


@dataclass
class Pack:
    ids: np.ndarray  # [seq_len] int64, padded with pad_id
    positions: np.ndarray  # [seq_len] position ids, restarting per example
    targets: np.ndarray  # [seq_len] bool: token t is a loss target (predicted from t-1)
    used: int  # tokens that are not padding


def pack(examples: list[Example], order: np.ndarray, seq_len: int, pad_id: int) -> list[Pack]:
    packs: list[Pack] = []
    cur: list[tuple[list[int], list[int]]] = []
    used = 0
    for i in order:
        ex = examples[int(i)]
        n = min(len(ex.ids), seq_len)
        if used + n > seq_len and cur:
            packs.append(_build(cur, seq_len, pad_id))
            cur, used = [], 0
        cur.append((ex.ids[:n], ex.mask[:n]))
        used += n
    if cur:
        packs.append(_build(cur, seq_len, pad_id))
    return packs


def _build(parts, seq_len: int, pad_id: int) -> Pack:
    ids = np.full(seq_len, pad_id, dtype=np.int64)
    pos = np.zeros(seq_len, dtype=np.int64)
    tgt = np.zeros(seq_len, dtype=bool)
    at = 0
    for p_ids, p_mask in parts:
        n = len(p_ids)
        ids[at : at + n] = p_ids
        pos[at : at + n] = np.arange(n)
        tgt[at : at + n] = np.asarray(p_mask, dtype=bool)
        tgt[at] = False  # the first token of an example has no predecessor in it
        at += n
    if at < seq_len:  # padding: its own "example", never a target
        pos[at:] = np.arange(seq_len - at)
    return Pack(ids, pos, tgt, at)


class SFTData:
    """Deterministic stream of packs; ``position`` = (epoch, next pack index) is resumable."""

    def __init__(self, examples: list[Example], seq_len: int, pad_id: int, seed: int):
        self.examples, self.seq_len, self.pad_id, self.seed = examples, seq_len, pad_id, seed
        self.epoch, self.index = 0, 0
        self._packs: list[Pack] | None = None

    def packs_for(self, epoch: int) -> list[Pack]:
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
        return pack(self.examples, order, self.seq_len, self.pad_id)

    @property
    def position(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def seek(self, position: dict) -> None:
        self.epoch, self.index, self._packs = int(position["epoch"]), int(position["index"]), None

    def take(self, n: int) -> list[Pack]:
        out: list[Pack] = []
        while len(out) < n:
            if self._packs is None:
                self._packs = self.packs_for(self.epoch)
            if self.index >= len(self._packs):
                self.epoch, self.index, self._packs = self.epoch + 1, 0, None
                continue
            out.append(self._packs[self.index])
            self.index += 1
        return out
