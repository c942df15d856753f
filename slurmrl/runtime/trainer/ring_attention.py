"""Ring attention: exact causal per-document attention over a packed row split by sequence over ``cp`` ranks,
for any head count (Ulysses, ``context_parallel``, needs ``cp`` to divide the query heads).

Layout (``spans``): the row, padded to a multiple of ``2 cp`` (``context_parallel.shard``), is cut into
``2 cp`` equal chunks; rank ``r`` holds chunks ``r`` and ``2 cp - 1 - r`` (zigzag). Under a causal mask a
contiguous split gives the last rank ``cp`` times the first one's work on a long document, and every
ring step waits for the slowest rank; the zigzag pairs an early chunk with a late one, so each rank's
share of the causal triangle is equal (on rows of many short documents either layout is balanced).

Exchange (``_Ring``): every rank's K/V ([2, KV heads, tokens / cp, D]: the KV heads, not repeated to
the query heads) travels round the ring by point-to-point send/recv, ``cp - 1`` hops, each rank sending
to ``r + 1`` and receiving from ``r - 1``; the backward sends the gradients the other way round, summed
hop by hop, so each rank gets exactly the gradient of its own K/V.

Attention (``attention``): this first version receives every hop before any math (no overlap of transfer
with compute; K/V memory as an all-gather's), so each of this rank's query segments (a document's
tokens within one of its chunks) attends to its document's keys from the document's start to the
segment's end in one ``scaled_dot_product_attention`` call, causal from the bottom right
(``causal_lower_right``: every earlier key of the document, the segment's own keys causally): one softmax
over all its keys, no partials to combine, GQA without repeating K/V, exact gradients by autograd, and
on CUDA the fused kernels (no [T, T] scores). No token attends across a document boundary (the row's own
``cu_seq_lens``) or to a later token. A streaming ring (only two K/V blocks held, transfer overlapped
with compute) would combine per-block softmax partials by their log-sum-exp with a kernel that returns
it and a custom backward: not built.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def spans(n: int, rank: int, cp: int) -> list[tuple[int, int]]:
    """Rank ``rank``'s chunks ``[a, b)`` of a row of ``n`` tokens (a multiple of ``2 cp``), in row order."""
    if n % (2 * cp):
        raise ValueError(f"a ring row of {n} tokens does not split into 2 x {cp} chunks")
    c = n // (2 * cp)
    return [(rank * c, (rank + 1) * c), ((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]


def _shift(x: torch.Tensor, group, step: int) -> torch.Tensor:
    """``x`` sent to rank ``r + step`` of ``group``; what rank ``r - step`` sent, returned."""
    cp, r = dist.get_world_size(group), dist.get_rank(group)
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, group=group, group_peer=(r + step) % cp),
           dist.P2POp(dist.irecv, out, group=group, group_peer=(r - step) % cp)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out


class _Ring(torch.autograd.Function):
    """x (this rank's block) -> [cp, *x.shape]: block ``s`` is rank ``r - s``'s, passed round the ring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        blocks = [x.contiguous()]
        for _ in range(dist.get_world_size(group) - 1):
            blocks.append(_shift(blocks[-1], group, 1))
        return torch.stack(blocks)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # rank r's block s went to rank r + s: its gradient there comes back hop by hop, each rank
        # adding the gradient it holds for the block one hop nearer the owner
        acc = grad[-1].contiguous()
        for s in range(grad.shape[0] - 1, 0, -1):
            acc = _shift(acc, ctx.group, -1) + grad[s - 1]
        return acc, None


def _row(kv: torch.Tensor, n: int, rank: int, cp: int) -> torch.Tensor:
    """The ring's blocks ([cp, 2, Hk, n / cp, D], block ``s`` rank ``r - s``'s chunks) -> the row's K/V in
    row order, [2, Hk, n, D]."""
    c = n // (2 * cp)
    chunks: list[torch.Tensor | None] = [None] * (2 * cp)
    for s in range(cp):
        owner = (rank - s) % cp
        chunks[owner], chunks[2 * cp - 1 - owner] = kv[s, :, :, :c], kv[s, :, :, c:]
    return torch.cat([x for x in chunks if x is not None], dim=2)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: list[int], group,
              scaling: float | None = None) -> torch.Tensor:
    """query [1, Hq, T/cp, D], key/value [1, Hk, T/cp, D] (this rank's ``spans`` of a row whose document
    bounds are ``cu``, the whole row's) -> [1, T/cp, Hq, D], exact across the ranks."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    n = cu[-1]
    length = query.shape[2]
    if length * cp != n:
        raise RuntimeError(f"slurmrl: ring attention got {length} tokens of a {n}-token row over {cp} ranks")
    kv = _row(_Ring.apply(torch.stack([key, value]), group)[:, :, 0], n, rank, cp)  # [2, Hk, n, D]
    gqa = query.shape[1] != key.shape[1]
    outs = []
    offset = 0
    for qa, qb in spans(n, rank, cp):
        for doc_a, doc_b in zip(cu[:-1], cu[1:], strict=True):
            a, b = max(doc_a, qa), min(doc_b, qb)
            if a >= b:
                continue
            q = query[:, :, offset + a - qa: offset + b - qa]
            k, v = kv[0, None, :, doc_a:b], kv[1, None, :, doc_a:b]  # the document's keys up to the query's last
            if a == doc_a:  # the document starts here: causal, aligned at the top left as at the bottom right
                outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa))
            else:  # queries [a, b) see every earlier key of their document: causal from the bottom right
                mask = causal_lower_right(b - a, b - doc_a)
                outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa))
        offset += qb - qa
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()
