"""Context parallelism: one packed row split by sequence over the ``cp`` ranks of a group, its attention
by Ulysses (here) or by ring attention (``ring_attention``): ``install``'s ``style``.

Every rank holds an equal slice of the row (``shard``: the row padded to a multiple of ``cp``, or of
``2 cp`` for ring, with one extra document that is never a target; Ulysses: one contiguous slice, ring:
the two zigzag chunks of ``ring_attention.spans``) and runs the whole model on its slice:
embeddings, norms, MLPs, MoE layers and the LM head see only its own tokens; position ids are the
row's own, so rotary embeddings are unchanged. Attention alone needs the whole sequence. Ulysses:
``attend`` (installed as the model's attention function by ``install``) swaps sequence for heads with one
all-to-all (each rank: every token, ``heads / cp`` of the heads; KV heads are repeated to the query
heads first where ``cp`` does not divide them), runs ``doc_attention``'s per-document attention over
the row's document bounds (``cu_seq_lens``, so no token attends across a document boundary or across
the split), and swaps back. The all-to-all's backward is the same all-to-all, so gradients are exact.
Ring (any head count): ``ring_attend`` passes K/V round the ranks and combines softmax partials.

The loss is each rank's own tokens (``Slice.selection``: the positions in its slice whose next token
is a target; that token may lie in the next rank's slice: the ids are the row's). Summing every
rank's loss (and gradients, as FSDP's reduction does) gives the single-rank step;
``tests/test_parallel_steps.py`` checks loss and every gradient of a dense and a MoE model, both styles.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from slurmrl.runtime.trainer import doc_attention, ring_attention
from slurmrl.runtime.trainer.packing import PackedRow
from slurmrl.settings.mesh import ModelShape, problem
from slurmrl.settings.trainer import CpStyle, Parallel

NAMES = {"ulysses": "slurmrl_docs_ulysses", "ring": "slurmrl_docs_ring"}


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` over dim 0 (one equal block per rank); its backward is the same exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)  # of a contiguous tensor: contiguous (a permuted one's would not be)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """[1, H, T/cp, D] (this rank's tokens, every head) -> [1, H/cp, T, D] (every token, its heads)."""
    cp = dist.get_world_size(group)
    _, h, t, d = x.shape
    y = _AllToAll.apply(x.reshape(cp, h // cp, t, d), group)  # dim 0: from the rank that holds those tokens
    return y.permute(1, 0, 2, 3).reshape(1, h // cp, cp * t, d)


def heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """The inverse of ``seq_to_heads``: [1, H/cp, T, D] -> [1, H, T/cp, D]."""
    cp = dist.get_world_size(group)
    _, hl, t, d = x.shape
    y = x.reshape(hl, cp, t // cp, d).permute(1, 0, 2, 3)  # dim 0: the rank whose tokens these are
    return _AllToAll.apply(y, group).reshape(1, cp * hl, t // cp, d)


@torch.compiler.disable  # as doc_attention.attend: a compiled layer breaks its graph here
def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *, group, **kwargs):
    """transformers' attention interface on a sequence slice of ``group`` (bound by ``install``):
    query [1, Hq, T/cp, D] -> [1, T/cp, Hq, D]."""
    cp = dist.get_world_size(group)
    if query.shape[1] % cp:
        raise RuntimeError(f"slurmrl: context parallel {cp} does not divide the model's {query.shape[1]} heads")
    if key.shape[1] % cp:  # fewer KV heads than ranks: every rank gets its query heads' KV heads
        group_size = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group_size, 1), value.repeat_interleave(group_size, 1)
    q, k, v = (seq_to_heads(x, group) for x in (query, key, value))
    out, _ = doc_attention.attend(module, q, k, v, attention_mask, scaling, dropout, **kwargs)  # [1, T, Hq/cp, D]
    return heads_to_seq(out.transpose(1, 2), group).transpose(1, 2).contiguous(), None


@torch.compiler.disable
def ring_attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *, group=None, **kwargs):
    """transformers' attention interface on this rank's ring chunks of ``group`` (bound by ``install``):
    query [1, Hq, T/cp, D] -> [1, T/cp, Hq, D]."""
    if attention_mask is not None or kwargs.get("cu_seq_lens_q") is None:
        raise RuntimeError("slurmrl: ring attention takes a packed row's document bounds, no mask")
    cu = kwargs["cu_seq_lens_q"].tolist()
    window = kwargs.get("sliding_window")
    if (window is not None and max(b - a for a, b in zip(cu[:-1], cu[1:], strict=True)) > window) \
            or kwargs.get("s_aux") is not None:
        raise RuntimeError(f"slurmrl: ring attention has no sliding window or attention sinks; "
                           f"{type(module).__name__} uses one")
    out = ring_attention.attention(query, key, value, cu, group, scaling)
    return out, None


def style_of(heads: int, cp: int, style: CpStyle | None) -> CpStyle:
    """``style`` (None: Ulysses where ``cp`` divides ``heads``, else ring); ValueError where Ulysses cannot
    split them (the mesh rule of ``settings.mesh``)."""
    p = Parallel(cp=cp, cp_style=style)
    why = problem(p, cp, 0, model=ModelShape(heads=heads))
    if why is not None:
        raise ValueError(f"slurmrl: {why[0]}: {why[1]}")
    chosen = p.style_for(heads)
    assert chosen is not None, "heads are known: a style is chosen"
    return chosen


def install(model, group, style: CpStyle | None = None) -> CpStyle:
    """Attention over ``group``'s sequence slices for ``model`` (which ``doc_attention.install`` took), by
    ``style`` (None: Ulysses where the group's size divides the model's heads, else ring) -> the style
    installed, which ``shard`` must be given to lay rows out for it. The group is bound into the
    attention function registered under a name of its own (nothing process-wide of ours to overwrite)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    style = style_of(model.config.num_attention_heads, dist.get_world_size(group), style)
    name = f"{NAMES[style]}_{id(group):x}"
    AttentionInterface.register(name, functools.partial(attend if style == "ulysses" else ring_attend, group=group))
    AttentionMaskInterface.register(name, doc_attention._no_mask)
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise RuntimeError(f"slurmrl: context parallelism needs transformers' attention interface; "
                           f"{type(model).__name__} has none")
    return style


@dataclass
class Slice(PackedRow):
    """Rank ``r``'s tokens of a row (``spans``: ``[a, b)`` ranges in row order): what
    ``token_forward.logprobs`` takes in its place."""

    spans: tuple[tuple[int, int], ...] = ()
    full_ids: torch.Tensor | None = None  # [1, N] the whole row's ids: the next token may be the next rank's

    def positions(self) -> torch.Tensor:
        """The row positions of this slice's tokens, in order."""
        return torch.cat([torch.arange(a, b) for a, b in self.spans])

    def _mine(self) -> torch.Tensor:
        held = torch.zeros(self.targets.shape[1], dtype=torch.bool)
        for a, b in self.spans:
            held[a:b] = True
        return self.targets[0, 1:] & held[:-1]

    def selection(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.full_ids is not None, "shard() sets it"
        index = self._mine().nonzero().squeeze(1)
        local = torch.searchsorted(self.positions(), index)
        return local.to(device), self.full_ids[0, 1:][index].to(device)

    def at_targets(self, name: str, device: torch.device) -> torch.Tensor:
        return self.extra[name][0, 1:][self._mine()].to(device)


def shard(row: PackedRow, rank: int, cp: int, pad_id: int = 0, *, style: CpStyle) -> Slice:
    """Rank ``rank``'s equal share of ``row`` for ``style`` (the one ``install`` returned), the row padded
    with one more document to a multiple of ``cp`` (Ulysses: one contiguous slice) or ``2 cp`` (ring: its chunks)."""
    n = row.tokens
    pad = -n % (2 * cp if style == "ring" else cp)
    ids, pos, tgt, cu, extra, experts = row.input_ids, row.position_ids, row.targets, row.cu_seqlens, row.extra, row.experts
    if pad:
        ids = torch.cat([ids, torch.full((1, pad), pad_id, dtype=ids.dtype)], 1)
        pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype)[None]], 1)
        tgt = torch.cat([tgt, torch.zeros((1, pad), dtype=tgt.dtype)], 1)
        cu = torch.cat([cu, torch.tensor([n + pad], dtype=cu.dtype)])
        extra = {k: torch.cat([v, torch.zeros((1, pad), dtype=v.dtype)], 1) for k, v in extra.items()}
        if experts is not None:
            experts = torch.cat([experts, torch.full((pad, *experts.shape[1:]), -1, dtype=experts.dtype)])
    size = (n + pad) // cp
    held = ring_attention.spans(n + pad, rank, cp) if style == "ring" else [(rank * size, (rank + 1) * size)]
    index = torch.cat([torch.arange(a, b) for a, b in held])
    return Slice(ids[:, index], pos[:, index], tgt, cu, extra, None if experts is None else experts[index],
                 spans=tuple(held), full_ids=ids)
