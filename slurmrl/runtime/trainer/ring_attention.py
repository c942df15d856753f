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
hop by hop, so each rank gets exactly the gradient of its own K/V. This first version receives every
block before the attention math (no overlap of transfer with compute) and keeps them for the backward:
K/V memory as an all-gather's.

Attention (``attention``): for each of this rank's query chunks, each document it holds, and each K/V
chunk of the same document that is not later in the row: the block's softmax partial (output and
log-sum-exp), causal on the diagonal chunk, unmasked on earlier chunks; the partials combine by their
log-sum-exp into the exact softmax. No token attends across a document boundary (``cu_seq_lens``, the
row's own) or to a later token. The block math is plain torch (matmul, logsumexp) in float32 at least,
differentiable by autograd: exact on CPU in float64; not yet a flash kernel (a block holds
heads x chunk x chunk scores), so long rows on a GPU want a kernel that returns the log-sum-exp.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


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


def _block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool):
    """q [Hk, g, a, D] (g query heads per KV head), k/v [Hk, b, D] -> (out [Hk, g, a, D], lse [Hk, g, a])."""
    s = torch.matmul(q, k.unsqueeze(1).transpose(-1, -2)) * scale
    if causal:  # the diagonal chunk: a == b, the same tokens
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.unsqueeze(1)), lse


def _combine(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Softmax partials over disjoint key sets -> the softmax over their union."""
    if len(parts) == 1:
        return parts[0][0]
    lse = torch.stack([p[1] for p in parts])
    weights = torch.exp(lse - torch.logsumexp(lse, dim=0)).unsqueeze(-1)
    return (torch.stack([p[0] for p in parts]) * weights).sum(0)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: list[int], group,
              scaling: float | None = None) -> torch.Tensor:
    """query [1, Hq, T/cp, D], key/value [1, Hk, T/cp, D] (this rank's ``spans`` of a row whose document
    bounds are ``cu``, the whole row's) -> [1, T/cp, Hq, D], exact across the ranks."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    n = cu[-1]
    hq, hk, length, d = query.shape[1], key.shape[1], query.shape[2], query.shape[3]
    if length * cp != n:
        raise RuntimeError(f"slurmrl: ring attention got {length} tokens of a {n}-token row over {cp} ranks")
    scale = d ** -0.5 if scaling is None else scaling
    dtype = query.dtype if query.dtype in (torch.float32, torch.float64) else torch.float32
    q = query[0].to(dtype).reshape(hk, hq // hk, length, d)  # query head h reads KV head h // (Hq / Hk)
    kv = _Ring.apply(torch.stack([key[0], value[0]]), group).to(dtype)  # [cp, 2, Hk, T/cp, D]
    mine = spans(n, rank, cp)
    held = [(spans(n, (rank - s) % cp, cp), kv[s]) for s in range(cp)]  # the K/V chunks each block holds
    outs = []
    offset = 0
    for qa, qb in mine:
        for doc_a, doc_b in zip(cu[:-1], cu[1:], strict=True):
            a, b = max(doc_a, qa), min(doc_b, qb)
            if a >= b:
                continue
            qs = q[:, :, offset + a - qa: offset + b - qa]
            parts = []
            for chunks, block in held:
                local = 0
                for ka, kb in chunks:
                    ka2, kb2 = max(doc_a, ka), min(doc_b, kb)
                    if ka <= qa and ka2 < kb2:  # this document's keys in a chunk not after the query's
                        ks = block[:, :, local + ka2 - ka: local + kb2 - ka]
                        parts.append(_block(qs, ks[0], ks[1], scale, causal=ka == qa))
                    local += kb - ka
            outs.append(_combine(parts))
        offset += qb - qa
    out = torch.cat(outs, dim=2).reshape(hq, length, d)
    return out.transpose(0, 1).unsqueeze(0).to(query.dtype)
