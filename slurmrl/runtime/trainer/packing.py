"""Packed rows: documents laid end to end in one row, no padding, no mask.

A ``PackedRow`` is one [1, N] row of token ids with position ids that restart at 0 for every
document, the loss targets, and the documents' cumulative lengths (``cu_seqlens``) that
``doc_attention`` masks by. The loss reads the hidden state at t for the token at t + 1 where
``targets[t + 1]``; the first token of every document is never a target, so nothing is predicted
across a boundary. ``extra`` carries per-token float columns (RL: the inference logprob and the
advantage at each token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class PackedRow:
    input_ids: torch.Tensor  # [1, N] int64
    position_ids: torch.Tensor  # [1, N] int64, 0 at each document's first token
    targets: torch.Tensor  # [1, N] bool: token t is a loss target (predicted from t - 1)
    cu_seqlens: torch.Tensor  # [D + 1] int32, CPU
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [1, N] float32
    experts: torch.Tensor | None = None  # [N, MoE layers, top_k] int64: the experts inference used, -1: none

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def documents(self) -> int:
        return int(self.cu_seqlens.numel()) - 1

    def attention_kwargs(self, device: torch.device) -> dict:
        """What the model's forward passes down to ``doc_attention.attend``."""
        cu = self.cu_seqlens.to(device)
        longest = int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max()) if self.documents else 0
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}

    def selection(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, next token): flat positions t whose hidden state predicts a target token t + 1."""
        sel = self.targets[0, 1:]
        index = sel.nonzero().squeeze(1)
        nxt = self.input_ids[0, 1:][index]
        return index.to(device), nxt.to(device)

    def at_targets(self, name: str, device: torch.device) -> torch.Tensor:
        """``extra[name]`` at the target tokens, in ``selection`` order."""
        return self.extra[name][0, 1:][self.targets[0, 1:]].to(device)


def cu_from_positions(positions: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Document starts are where the position id is 0 (and the row's first token)."""
    pos = torch.as_tensor(np.asarray(positions)).reshape(-1)
    starts = (pos == 0).nonzero().squeeze(1).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return torch.tensor([*starts, pos.numel()], dtype=torch.int32)


def pack_documents(docs: list[tuple[list[int], list[bool]]], extra: dict[str, list[list[float]]] | None = None,
                   ) -> PackedRow:
    """Documents (token ids, target flags) end to end; ``extra[name][i]`` holds document i's
    per-token values. The first token of each document is never a target."""
    ids: list[int] = []
    pos: list[int] = []
    tgt: list[bool] = []
    cu = [0]
    for d_ids, d_tgt in docs:
        n = len(d_ids)
        if n == 0:  # nothing to attend to or predict
            continue
        ids += d_ids
        pos += range(n)
        flags = list(d_tgt[:n])
        if flags:
            flags[0] = False
        tgt += flags
        cu.append(cu[-1] + n)
    cols = {k: torch.tensor([x for doc in v for x in doc], dtype=torch.float32).unsqueeze(0)
            for k, v in (extra or {}).items()}
    return PackedRow(torch.tensor(ids, dtype=torch.long).unsqueeze(0), torch.tensor(pos, dtype=torch.long).unsqueeze(0),
                     torch.tensor(tgt, dtype=torch.bool).unsqueeze(0), torch.tensor(cu, dtype=torch.int32), cols)


def pack_sft(packs) -> PackedRow:
    """SFT packs (``data.Pack``: examples already end to end, padded to seq_len) as one row
    without their padding."""
    ids = np.concatenate([p.ids[: p.used] for p in packs])
    pos = np.concatenate([p.positions[: p.used] for p in packs])
    tgt = np.concatenate([p.targets[: p.used] for p in packs])
    return PackedRow(torch.from_numpy(ids).unsqueeze(0), torch.from_numpy(pos).unsqueeze(0),
                     torch.from_numpy(tgt).unsqueeze(0), cu_from_positions(pos))
