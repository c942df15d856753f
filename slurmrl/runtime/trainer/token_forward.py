"""One forward of a packed row to per-target-token log-probabilities and entropies.

``FastPath.prepare(model)`` installs what the model supports: the chunked LM head
(``chunked_head``) and the per-document attention (``doc_attention``). ``logprobs(model, row)``
then returns float32 ``logp`` (with gradient) and ``entropy`` (none) at ``row``'s target tokens,
in ``PackedRow.selection`` order. Where the model cannot take one of them (a soft-capped or
biased head; a model class without transformers' attention interface), the forward still runs on
the packed row and stays exact: full logits at the selected positions, or transformers' own
block-diagonal mask; ``describe`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slurmrl.runtime.trainer import chunked_head, doc_attention, losses
from slurmrl.runtime.trainer.lora import AdaptersOff
from slurmrl.runtime.trainer.packing import PackedRow


def _base(model):
    return model.model if isinstance(model, AdaptersOff) else model


@dataclass
class FastPath:
    chunked_head: bool = False
    doc_attention: bool = False
    why_not_head: str | None = None

    @classmethod
    def prepare(cls, model) -> FastPath:
        why = chunked_head.supports(model)
        if why is None:
            chunked_head.install(model)
        return cls(chunked_head=why is None, doc_attention=doc_attention.install(model), why_not_head=why)

    def describe(self) -> str:
        head = "chunked LM head + log-softmax" if self.chunked_head else f"full logits ({self.why_not_head})"
        attn = ("per-document attention, no mask" if self.doc_attention
                else "transformers' attention with its block-diagonal mask (model class has no attention interface)")
        return f"packed rows; {head}; {attn}"


def logprobs(model, row: PackedRow, device: torch.device, fast: FastPath) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) at ``row``'s target tokens, float32 [N]."""
    index, nxt = row.selection(device)
    ids, pos = row.input_ids.to(device), row.position_ids.to(device)
    kwargs = row.attention_kwargs(device) if fast.doc_attention else {}
    head = _base(model).get_output_embeddings()
    if fast.chunked_head and isinstance(head, chunked_head.ChunkedHead):
        head.select(index, nxt)
        out = model(input_ids=ids, position_ids=pos, use_cache=False, **kwargs).logits
        return out[:, 0], out[:, 1]
    logits = model(input_ids=ids, position_ids=pos, use_cache=False, **kwargs).logits[0].index_select(0, index)
    logp = losses.token_logprobs(logits, nxt)
    with torch.no_grad():
        lp = torch.log_softmax(logits.detach().float(), dim=-1)
        entropy = -(lp.exp() * lp).sum(-1)
    return logp, entropy
