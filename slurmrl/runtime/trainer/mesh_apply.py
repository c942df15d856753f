"""Expert parallelism in the trainer's loop: the experts split over ``ep`` ranks beside FSDP2.

The ``world = dp_shard x cp`` ranks form ``world / ep`` expert groups of ``ep`` consecutive ranks
(``[g * ep, (g + 1) * ep)``); rank r holds experts slice ``r % ep`` of every MoE layer
(``expert_parallel.shard``). FSDP2 shards everything else over all ranks and leaves the expert
slices out (``ignored_params``): each rank keeps its slice whole, with its gradients and AdamW state.
Ranks with the same slice (one per expert group: ``world / ep`` of them) are its replicas. The groups
themselves are made with the rest of the trainer's mesh (``mesh.TrainerMesh``); ``ExpertMesh`` is what
the loop does with them.

Why out of FSDP2 rather than sharded again over the remaining ranks: a slice's gradient already
sums every token routed to it (the all-to-all's backward brings them home), so a replica set's
all-reduce is all it needs, and with ``ep = dp_shard x cp`` (the layout for a model whose experts are
most of its weights) there is no remaining rank to shard over. Sharding over ``world / ep`` as well
(torchtitan's "efsdp") would save memory at ``ep < world`` only; it is not built.

- **Gradients** (``reduce_grads``): the loop scales each rank's loss by ``world / target tokens``
  and FSDP2 averages over ``world``; a slice's gradient holds its whole expert group's tokens at
  that scale, so it is divided by ``world`` and summed over its replicas: every token once.
- **Grad norm** (``grad_norm_and_clip``): the FSDP2 shards' squares summed over all ranks, plus
  the expert slices' squares summed over one expert group (every expert exactly once), clipped as
  ``torch.nn.utils.clip_grad_norm_`` clips.
- **Checkpoints** (``full_state``, ``full_optimizer``, ``local_optimizer``): the slices gathered
  back to the model's own HF names and shapes, AdamW's moments too, so a checkpoint is the one an
  ``ep = 1`` run writes; on resume each rank takes its slice of them.
- **Published weights**: each slice parameter carries ``SLICE`` (its expert group and replica
  index); ``snapshot.Layout`` counts the first replica set's rows of each expert tensor in rank
  order, so the published safetensors hold the full ``[experts, ...]`` tensors.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from slurmrl.runtime.trainer import expert_parallel

SLICE = "_slurmrl_expert_slice"  # on an expert slice parameter: (ep rank, ep, replica index)


class ExpertMesh:
    """This rank's expert group and replica set, as ``mesh.TrainerMesh`` made them (``replicas``: None
    where one expert group is every rank)."""

    def __init__(self, world: int, rank: int, ep: int, group: dist.ProcessGroup, replicas: dist.ProcessGroup | None):
        self.world, self.rank, self.ep = world, rank, ep
        self.ep_rank, self.replica = rank % ep, rank // ep
        self.group, self.replicas = group, replicas

    def describe(self) -> str:
        return (f"expert parallel: ep {self.ep}, {self.world // self.ep} expert group(s); rank {self.rank} holds "
                f"expert slice {self.ep_rank} (outside FSDP2, {self.world // self.ep} replica(s))")

    def apply(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        """Keep this rank's expert slices (before FSDP2); the slice parameters, which FSDP2 must ignore."""
        if not expert_parallel.shard(model, self.group):
            raise SystemExit(f"slurmrl: trainer: trainer.parallel.ep = {self.ep}: {type(model).__name__} has no "
                             "stacked experts module to split")
        found = [p for m in expert_parallel.experts_modules(model) for p in (m.gate_up_proj, m.down_proj)]
        for p in found:
            setattr(p, SLICE, (self.ep_rank, self.ep, self.replica))
        return found

    @staticmethod
    def is_slice(p: torch.Tensor) -> bool:
        return hasattr(p, SLICE)

    def _mine(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if self.is_slice(p)]

    def reduce_grads(self, model: torch.nn.Module) -> None:
        """Every slice's gradient to the sum over all ranks' tokens at the loop's scale (see the module doc)."""
        for p in self._mine(model):
            if p.grad is None:
                continue
            p.grad.div_(self.world)
            if self.replicas is not None:
                dist.all_reduce(p.grad, group=self.replicas)

    def grad_norm_and_clip(self, model: torch.nn.Module, max_norm: float) -> float:
        """``reduce_grads``, then the norm of every gradient (each expert once), clipped to ``max_norm``."""
        self.reduce_grads(model)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        mine = {id(p.grad) for p in self._mine(model) if p.grad is not None}
        device = grads[0].device if grads else torch.device("cpu")
        shards, slices = torch.zeros((), device=device), torch.zeros((), device=device)
        for g in grads:
            local = g.to_local() if hasattr(g, "to_local") else g
            sq = local.detach().float().pow(2).sum()
            if id(g) in mine:
                slices += sq
            else:
                shards += sq
        dist.all_reduce(shards)
        dist.all_reduce(slices, group=self.group)
        norm = float((shards + slices).sqrt())
        coef = max_norm / (norm + 1e-6)
        if math.isfinite(norm) and coef < 1.0:  # a non-finite norm: the loop skips the step
            for g in grads:
                g.mul_(coef)
        return norm

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """A slice's tensor (parameter or AdamW moment) -> the full ``[experts, ...]`` tensor, on the CPU."""
        parts = [torch.empty_like(t) for _ in range(self.ep)]
        dist.all_gather(parts, t.detach().contiguous(), group=self.group)
        return torch.cat(parts).cpu()

    def slice_of(self, full: torch.Tensor) -> torch.Tensor:
        local = full.shape[0] // self.ep
        return full[self.ep_rank * local : (self.ep_rank + 1) * local].clone()

    def slice_names(self, model: torch.nn.Module) -> list[str]:
        return [n for n, p in model.named_parameters() if self.is_slice(p)]

    def full_state(self, model: torch.nn.Module, state: dict[str, torch.Tensor], rank: int) -> dict:
        """``state`` (a full state dict on rank 0, empty elsewhere) with every slice gathered whole. Collective."""
        params = dict(model.named_parameters())
        for name in self.slice_names(model):
            full = self.gather(params[name])
            if rank == 0:
                state[name] = full
        return state

    def full_optimizer(self, model: torch.nn.Module, optim: torch.optim.Optimizer, osd: dict, rank: int) -> dict:
        """``osd`` (``get_optimizer_state_dict``, full, on rank 0) with every slice's moments whole. Collective."""
        by_param = {id(p): n for n, p in model.named_parameters()}
        for p in self._mine(model):
            st = optim.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    full = self.gather(st[key])
                    if rank == 0:
                        osd["state"][by_param[id(p)]][key] = full
        return osd

    def local_optimizer(self, model: torch.nn.Module, osd: dict) -> dict:
        """A full optimizer state dict (every rank read it) with each slice's moments cut to this rank's slice."""
        for name in self.slice_names(model):
            st = osd["state"].get(name, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    st[key] = self.slice_of(st[key])
        return osd
