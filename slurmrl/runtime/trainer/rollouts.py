"""RL batches: read ``rollouts/step-NNNNNN.json``, split it over ranks and micro-batches.

A sample is ``prompt_ids + completion_ids`` (cut to ``seq_len``), right-padded within its
micro-batch; with a causal mask, padding on the right never reaches a real token, so no
attention mask is needed. Targets are the completion tokens; ``old_logp`` holds the inference
logprob at each completion token (NaN where it is missing).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch


def read_batch(path: Path) -> dict:
    for attempt in range(50):  # the file is renamed into place, but a shared filesystem may lag
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, FileNotFoundError):
            if attempt == 49:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, T] bool: completion token (a loss target)
    old_logp: torch.Tensor  # [B, T] float32, inference logprob at completion tokens
    advantages: torch.Tensor  # [B, 1]


def _tensors(samples: list[dict], seq_len: int, pad_id: int, dummy: bool) -> MicroBatch:
    rows = []
    for s in samples:
        p, c = list(s["prompt_ids"]), list(s["completion_ids"])
        lp = [math.nan if v is None else float(v) for v in s.get("logprobs") or []]
        lp += [math.nan] * (len(c) - len(lp))
        ids = (p + c)[:seq_len]
        tgt = ([False] * len(p) + [not dummy] * len(c))[:seq_len]
        old = ([math.nan] * len(p) + lp[: len(c)])[:seq_len]
        if ids:
            tgt[0] = False
        rows.append((ids, tgt, old, float(s.get("advantage", 0.0))))
    width = max(len(r[0]) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    tgt = torch.zeros((b, width), dtype=torch.bool)
    old = torch.full((b, width), math.nan, dtype=torch.float32)
    for i, (r_ids, r_tgt, r_old, _) in enumerate(rows):
        n = len(r_ids)
        ids[i, :n] = torch.tensor(r_ids, dtype=torch.long)
        tgt[i, :n] = torch.tensor(r_tgt, dtype=torch.bool)
        old[i, :n] = torch.tensor(r_old, dtype=torch.float32)
    pos = torch.arange(width).unsqueeze(0).expand(b, -1).contiguous()
    adv = torch.tensor([[r[3]] for r in rows], dtype=torch.float32)
    return MicroBatch(ids, pos, tgt, old, adv)


def target_tokens(samples: list[dict], seq_len: int) -> int:
    """Completion tokens that are loss targets, over the whole batch (as ``_tensors`` marks them)."""
    n = 0
    for s in samples:
        p, c = len(s["prompt_ids"]), len(s["completion_ids"])
        n += max(0, min(p + c, seq_len) - max(p, 1))
    return n


def split(samples: list[dict], rank: int, world: int, micro: int, seq_len: int, pad_id: int) -> list[MicroBatch]:
    """This rank's micro-batches. Every rank gets the same number (collectives stay in step);
    a rank short of samples gets a masked copy of one (no loss, no tokens)."""
    mine = samples[rank::world]
    n_micro = max(1, math.ceil(math.ceil(len(samples) / world) / micro))
    out = []
    for k in range(n_micro):
        chunk = mine[k * micro : (k + 1) * micro]
        out.append(_tensors(chunk, seq_len, pad_id, False) if chunk else _tensors(samples[:1], seq_len, pad_id, True))
    return out
