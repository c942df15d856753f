"""Attention over a packed row, masked per document without a dense [T, T] mask.

A packed row holds several documents (SFT examples, RL samples) end to end; ``cu_seq_lens_q``
(int32, [D + 1], the documents' cumulative lengths) tells where each starts. Given to the model's
forward as keyword arguments (``packing.PackedRow.attention_kwargs``), they reach every attention
layer through transformers' attention interface, where this module's ``attend`` runs:

- CUDA, bf16/fp16, and ``torch.nn.attention.varlen.varlen_attn`` present (torch >= 2.10): one
  variable-length flash-attention call per layer, causal inside each document;
- elsewhere (CPU, float32): causal ``scaled_dot_product_attention`` per document, concatenated.
  (FlexAttention with a document ``BlockMask`` was the other candidate: it has no backward on CPU
  in torch 2.13, and varlen flash covers CUDA.)

Neither builds a mask: ``install`` registers a mask function that returns None, so transformers'
``create_causal_mask`` (which builds a dense block-diagonal mask for packed position ids under
``sdpa``/``eager``) builds nothing. Without ``cu_seq_lens_q`` the row is one causal document.
"""

from __future__ import annotations

import inspect
import itertools

import torch
import torch.nn.functional as F

NAME = "slurmrl_docs"

try:
    from torch.nn.attention.varlen import varlen_attn as _varlen
    _VARLEN_ARGS = set(inspect.signature(_varlen).parameters)
except ImportError:  # torch < 2.10
    _varlen, _VARLEN_ARGS = None, set()


def _per_document(q, k, v, bounds: list[int], scaling, gqa: bool) -> torch.Tensor:
    outs = []
    for a, b in itertools.pairwise(bounds):
        if b > a:
            outs.append(F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True,
                                                       scale=scaling, enable_gqa=gqa))
    return torch.cat(outs, dim=2)


def _varlen_ok(q: torch.Tensor) -> bool:
    return _varlen is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:  # [T, Hk, D] -> [T, Hk * n, D]
    return x if n == 1 else x.repeat_interleave(n, dim=1)


def _flash_varlen(q, k, v, cu: torch.Tensor, max_len: int, scaling) -> torch.Tensor:
    qt, kt, vt = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)  # [T, H, D]
    kw = {"scale": scaling}
    group = qt.shape[1] // kt.shape[1]
    if "enable_gqa" in _VARLEN_ARGS:
        kw["enable_gqa"] = group > 1
    else:
        kt, vt = _repeat_kv(kt, group), _repeat_kv(vt, group)
    if "window_size" in _VARLEN_ARGS:
        kw["window_size"] = (-1, 0)
    else:
        kw["is_causal"] = True
    out = _varlen(qt.contiguous(), kt.contiguous(), vt.contiguous(), cu, cu, max_len, max_len, **kw)
    return out.unsqueeze(0)  # [1, T, H, D]


@torch.compiler.disable  # a compiled decoder layer breaks its graph here: no recompiles per document layout
def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-interface signature: query [B, Hq, T, D], key/value [B, Hk, T, D] ->
    ([B, T, Hq, D], None). ``attention_mask`` is None (``install``'s mask function)."""
    if attention_mask is not None:
        raise RuntimeError("slurmrl: document attention got a dense mask; it builds none itself")
    cu = kwargs.get("cu_seq_lens_q")
    gqa = query.shape[1] != key.shape[1]
    t = query.shape[2]
    if cu is None:
        bounds = [0, t]
    elif query.shape[0] != 1:
        raise RuntimeError(f"slurmrl: a packed forward holds one row, not {query.shape[0]}")
    elif _varlen_ok(query):
        return _flash_varlen(query, key, value, cu, int(kwargs["max_length_q"]), scaling), None
    else:
        bounds = cu.tolist()
    out = _per_document(query, key, value, bounds, scaling, gqa)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None


def install(model) -> bool:
    """Point ``model``'s attention at ``attend`` (registered once). False where the model's class
    cannot take a registered attention function (it keeps its own, with a dense mask when packed)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attend)
    AttentionMaskInterface.register(NAME, _no_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, NotImplementedError):
        return False
    return model.config._attn_implementation == NAME
