"""Expert parallelism: each of ``ep`` ranks holds ``experts / ep`` of every MoE layer's experts, and a
token goes to the rank of each expert it is routed to and back (two all-to-alls per layer).

``shard(model, group)`` keeps rank ``r``'s slice ``[r * E/ep, (r + 1) * E/ep)`` of every experts
module's stacked weights (transformers' ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``: the
Qwen2/3-MoE, OLMoE, Mixtral, GLM-4-MoE, DeepSeek-V3 layout) and replaces its forward with
``forward``: the (token, expert) pairs sorted by expert, sent to the experts' ranks with
``all_to_all_single`` (uneven splits; the backward is the reverse exchange), the local experts run as
two grouped GEMMs (``torch.nn.functional.grouped_mm`` with per-expert offsets: one call per projection,
no loop over experts), the results sent back and summed per token with the router's weights, as the
model's own experts module does. Routers, attention and everything else run on each rank's own
tokens, unchanged: the router's auxiliary load-balance loss is the model's own, from its own logits.

``full_state(model, group)`` gathers the slices back into the model's own state dict (plain HF names
and shapes): checkpoints in and published weights out stay the safetensors vLLM loads.
``tests/test_parallel_steps.py`` checks an ep=2 step's loss and every gradient against one rank.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist

_grouped_mm = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


class _AllToAllV(torch.autograd.Function):
    """Rows of ``x`` to the ranks of ``group`` (``send[i]`` rows to rank i, ``recv[i]`` from it)."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


class _Contiguous(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient (grouped_mm's CPU backward needs one)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``x[rows of group g] @ w[g].T`` for every group at once: x [R, in], w [G, out, in] -> [R, out]."""
    if _grouped_mm is None:
        raise RuntimeError("slurmrl: expert parallelism needs torch.nn.functional.grouped_mm (torch >= 2.9)")
    return _Contiguous.apply(_grouped_mm(x, w.transpose(-2, -1), offs=offs))


def supports(experts: torch.nn.Module) -> str | None:
    """Why ``experts`` cannot be sharded (None: it can)."""
    need = ("gate_up_proj", "down_proj", "num_experts", "act_fn")
    missing = [a for a in need if not hasattr(experts, a)]
    if missing:
        return f"{type(experts).__name__} has no {', '.join(missing)}"
    if getattr(experts, "is_transposed", False) or getattr(experts, "has_bias", False):
        return f"{type(experts).__name__} stores transposed or biased experts"
    return None


def experts_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts")]


def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """The experts module's forward with its experts on ``self.ep_group``'s ranks (see the module doc)."""
    group, local = self.ep_group, self.gate_up_proj.shape[0]
    rank, ep = dist.get_rank(group), dist.get_world_size(group)
    n, k = top_k_index.shape
    ids = top_k_index.reshape(-1)
    order = torch.argsort(ids, stable=True)  # (token, expert) pairs by expert: by destination rank too
    ids_sorted = ids[order]
    send = torch.bincount(ids_sorted // local, minlength=ep)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_l, recv_l = send.tolist(), recv.tolist()
    x = _AllToAllV.apply(hidden_states[order // k], send_l, recv_l, group)
    got = ids_sorted.new_empty(sum(recv_l))
    dist.all_to_all_single(got, ids_sorted, recv_l, send_l, group=group)
    mine = got - rank * local  # this rank's expert of each row received (grouped by sender, then expert)
    by_expert = torch.argsort(mine, stable=True)
    offs = torch.cumsum(torch.bincount(mine, minlength=local), 0).to(torch.int32)
    xs = x[by_expert]
    if xs.shape[0]:  # the slices stay float32 outside FSDP2's casts: computed in the activations' dtype
        gate, up = grouped(xs, self.gate_up_proj.to(xs.dtype), offs).chunk(2, dim=-1)
        ys = grouped(self.act_fn(gate) * up, self.down_proj.to(xs.dtype), offs)
    else:  # nothing routed here: the weights still join the graph (zero gradients, no unused parameters)
        ys = xs + 0 * (self.gate_up_proj.sum() + self.down_proj.sum())
    y = torch.empty_like(ys).index_copy(0, by_expert, ys)  # back to the order the rows came in
    back = _AllToAllV.apply(y, recv_l, send_l, group)  # [n * k, H] in ``order``
    weights = top_k_weights.reshape(-1)[order]
    out = torch.zeros_like(hidden_states)
    return out.index_add(0, order // k, (back * weights[:, None]).to(out.dtype))


def shard(model: torch.nn.Module, group) -> int:
    """Keep this rank's slice of every experts module's weights and route through ``forward``; the
    number of modules sharded. ValueError where the expert count does not split or a module's layout
    is not the stacked one."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    found = experts_modules(model)
    for m in found:
        why = supports(m)
        if why:
            raise ValueError(f"expert parallelism: {why}")
        if m.num_experts % ep:
            raise ValueError(f"expert parallelism: ep {ep} does not divide {m.num_experts} experts")
        local = m.num_experts // ep
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(m, name)
            setattr(m, name, torch.nn.Parameter(full.detach()[rank * local:(rank + 1) * local].clone(),
                                                requires_grad=full.requires_grad))
        m.ep_group = group
        m.forward = types.MethodType(forward, m)
    return len(found)


def is_expert_weight(name: str) -> bool:
    return name.endswith((".gate_up_proj", ".down_proj")) and ".experts." in f".{name}"


def full_state(model: torch.nn.Module, group) -> dict[str, torch.Tensor]:
    """The model's state dict with every expert slice gathered back to its full [E, ...] tensor (on
    every rank): the names and shapes of the unsharded model."""
    ep = dist.get_world_size(group)
    out = {}
    for name, t in model.state_dict().items():
        if is_expert_weight(name):
            parts = [torch.empty_like(t) for _ in range(ep)]
            dist.all_gather(parts, t.detach().contiguous(), group=group)
            t = torch.cat(parts)
        out[name] = t
    return out
