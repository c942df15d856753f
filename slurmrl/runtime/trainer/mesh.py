"""The trainer's device mesh in one object: ``TrainerMesh``, built from ``[trainer.parallel]``, the world
size torchrun started and this rank (torchtitan's ``ParallelDims`` is the model: one object of the
dimensions, checked when built, that builds the groups and hands them out).

Layout, rank ``r`` of ``world = dp_replicate x dp_shard x cp``:
- **FSDP2 / HSDP** (``fsdp``): one mesh of every rank, or with ``dp_replicate > 1`` a 2-D mesh
  ``(replicate, shard)``: ``dp_replicate`` copies of the model, each sharded over ``world / dp_replicate``
  consecutive ranks.
- **Context parallel** (``cp_group``): ``world / cp`` groups of ``cp`` consecutive ranks,
  ``[i cp, (i + 1) cp)``; a group shares each row (``cp_rank``: its slice), rows are split over the
  ``dp_world = world / cp`` groups (``dp_rank``).
- **Expert parallel** (``experts``, ``mesh_apply.ExpertMesh``): ``world / ep`` expert groups of ``ep``
  consecutive ranks; rank ``r`` holds expert slice ``r % ep``, and the ranks holding the same slice
  (``r % ep`` equal: one per expert group) are its replica set.

The rules a mesh must keep are ``settings/mesh.py``'s, the ones ``slurmrl plan`` refuses by:
``build`` checks them against torchrun's world (``dp_shard`` is taken from it, as the plan took it
from the trainer's GPUs) and ``check_model`` against the loaded model's experts and heads (for a hub
id plan had no numbers for). Nothing here is process-wide: the attention style lives with the
model it was installed on (``context_parallel.install``). ``tests/test_mesh_ranks.py`` checks the
groups every rank builds against these lists, over several shapes.
"""

from __future__ import annotations

from typing import NoReturn

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from slurmrl.runtime.trainer import router_replay
from slurmrl.runtime.trainer.mesh_apply import ExpertMesh
from slurmrl.settings.mesh import ModelShape, Problem, problem
from slurmrl.settings.trainer import Parallel


def refuse(why: Problem) -> NoReturn:
    field, sentence = why
    raise SystemExit(f"slurmrl: trainer: {field}: {sentence}")


class TrainerMesh:
    """The dimensions and this rank's place in them (arithmetic only until ``connect``)."""

    def __init__(self, p: Parallel, world: int, rank: int, seq_len: int = 0, lora: bool = False):
        self.world, self.rank, self.seq_len, self.lora = world, rank, seq_len, lora
        self.dp_replicate, self.cp, self.ep = p.dp_replicate, p.cp, p.ep
        self.dp_shard = world // (p.dp_replicate * p.cp)
        self.parallel = p.model_copy(update={"dp_shard": self.dp_shard})
        # the ranks of a cp group share each row (a slice each): rows are split over the dp ranks
        self.dp_world, self.dp_rank, self.cp_rank = world // p.cp, rank // p.cp, rank % p.cp
        self.ep_rank, self.ep_replica = rank % p.ep, rank // p.ep
        self.cp_group: dist.ProcessGroup | None = None
        self.experts: ExpertMesh | None = None
        self._fsdp: DeviceMesh | None = None

    @classmethod
    def build(cls, p: Parallel, world: int, rank: int, seq_len: int, lora: bool) -> TrainerMesh:
        """The mesh of ``p`` over ``world`` ranks for rows of ``seq_len`` tokens, checked (SystemExit
        naming the field) and its groups made (collective: every rank, in the same order)."""
        why = problem(p.model_copy(update={"dp_shard": None}), world, seq_len, lora)
        if why is not None:
            refuse(why)
        mesh = cls(p, world, rank, seq_len, lora)
        mesh.connect()
        return mesh

    # ---- the rank lists (every rank computes all of them) ----------------------------------
    def cp_ranks(self) -> list[list[int]]:
        return [list(range(first, first + self.cp)) for first in range(0, self.world, self.cp)]

    def ep_groups(self) -> list[list[int]]:
        return [list(range(first, first + self.ep)) for first in range(0, self.world, self.ep)]

    def replica_sets(self) -> list[list[int]]:
        """The ranks holding each expert slice (none where one expert group is every rank)."""
        return [list(range(r, self.world, self.ep)) for r in range(self.ep)] if self.world > self.ep else []

    def fsdp_shape(self) -> tuple[int, ...]:
        return (self.dp_replicate, self.world // self.dp_replicate) if self.dp_replicate > 1 else (self.world,)

    # ---- the groups ------------------------------------------------------------------------
    def connect(self) -> None:
        """Make the cp groups, then the expert groups and replica sets (collective, in this order)."""
        if self.cp > 1:
            self.cp_group = [dist.new_group(r) for r in self.cp_ranks()][self.rank // self.cp]
        if self.ep > 1:
            group = [dist.new_group(r) for r in self.ep_groups()][self.rank // self.ep]
            replicas = [dist.new_group(r) for r in self.replica_sets()]
            self.experts = ExpertMesh(self.world, self.rank, self.ep, group,
                                      replicas[self.ep_rank] if replicas else None)

    def fsdp(self, device_type: str) -> DeviceMesh:
        """FSDP2's device mesh (built once, at the first model sharded: collective)."""
        if self._fsdp is None:
            names = ("replicate", "shard") if self.dp_replicate > 1 else None
            self._fsdp = init_device_mesh(device_type, self.fsdp_shape(), mesh_dim_names=names)
        return self._fsdp

    # ---- checks and words ------------------------------------------------------------------
    def check_model(self, model) -> None:
        """The mesh against the loaded model's experts and attention heads (SystemExit naming the field)."""
        if self.ep == 1 and self.cp == 1:
            return
        shape = ModelShape.of(model.config.to_dict(), f"{type(model).__name__}'s config", router_replay.is_moe(model))
        why = problem(self.parallel, self.world, self.seq_len, self.lora, shape)
        if why is not None:
            refuse(why)

    def sharding(self, sharded: bool) -> str:
        if not sharded:
            return "no sharding"
        if self.dp_replicate > 1:
            return f"FSDP2 HSDP ({self.dp_replicate} replicas x {self.world // self.dp_replicate} shards)"
        return "FSDP2"

    def describe_cp(self, style: str) -> str:
        return f"context parallel: cp {self.cp} ({style}), {self.dp_world} data-parallel group(s)"

    def describe(self) -> str:
        """The whole mesh in one line, with this rank's place in it."""
        return (f"mesh: dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x cp {self.cp} = {self.world} "
                f"rank(s), ep {self.ep}; rank {self.rank}: dp rank {self.dp_rank} of {self.dp_world}, cp rank "
                f"{self.cp_rank}" + (f", expert slice {self.ep_rank}" if self.ep > 1 else ""))
