"""Where GPU components go: het groups, and a run of nodes plus GPU positions for each."""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurmrl.errors import UserError


@dataclass
class Slot:
    """Where a GPU component goes: a run of nodes in a group and GPU positions on each."""

    group: int
    first_node: int
    nodes: int
    gpus: tuple[int, ...]
    shared: bool = False


def colocated(b) -> dict[str, Slot]:
    """Trainer and inference on one node: GPUs split between them, or the same GPUs shared."""
    r, gpn = b.r, b.r.slurm.gpus_per_node
    g = b.group("rl", 1, gpn)
    inf, tr = r.inference, r.trainer
    if r.placement.share_gpus:
        n = inf.gpus_per_node or gpn
        return {
            "inference": Slot(g.index, 0, 1, tuple(range(n)), shared=True),
            "trainer": Slot(g.index, 0, 1, tuple(range(tr.gpus_per_node or n)), shared=True),
        }
    n = inf.gpus_per_node
    t = tr.gpus_per_node if tr.gpus_per_node is not None else gpn - n
    if t < 1 or n + t > gpn:
        raise UserError(
            "trainer.gpus_per_node",
            f"inference takes {n} of the node's {gpn} GPUs, so the trainer cannot have {max(t, 0)}; "
            "lower inference.gpus_per_node or set placement.share_gpus",
        )
    return {
        "inference": Slot(g.index, 0, 1, tuple(range(n)), shared=True),
        "trainer": Slot(g.index, 0, 1, tuple(range(n, n + t)), shared=True),
    }


def pd_role(b, role: str) -> Slot:
    """Nodes of one side of prefill/decode: as few as fit its replicas, unless given."""
    gpn = b.r.slurm.gpus_per_node
    spec = getattr(b.r.inference, role)
    nodes = spec.nodes or math.ceil(spec.replicas * spec.tp / gpn)
    field = f"inference.{role}"
    if spec.tp > gpn:
        raise UserError(f"{field}.tp", f"tp={spec.tp} needs more than the {gpn} GPUs of one node")
    if spec.replicas % nodes:
        raise UserError(
            f"{field}.replicas",
            f"{spec.replicas} replicas do not spread evenly over {nodes} nodes; use a multiple of {nodes}",
        )
    per_node = spec.replicas // nodes
    if per_node * spec.tp > gpn:
        raise UserError(
            f"{field}.nodes",
            f"{per_node} replicas x tp={spec.tp} per node need {per_node * spec.tp} GPUs; nodes have {gpn}",
        )
    g = b.group(role, nodes, gpn)
    return Slot(g.index, 0, nodes, tuple(range(per_node * spec.tp)))


def layout(b) -> dict[str, Slot]:
    r, gpn = b.r, b.r.slurm.gpus_per_node
    if r.placement.colocate:
        return colocated(b)
    slots: dict[str, Slot] = {}
    if r.trainer is not None:
        g = b.group("trainer", r.trainer.nodes, gpn)
        slots["trainer"] = Slot(g.index, 0, g.nodes, tuple(range(r.trainer.gpus_per_node or gpn)))
    inf = r.inference
    if inf is not None and inf.mode == "pd":
        for role in ("prefill", "decode"):
            slots[role] = pd_role(b, role)
    elif inf is not None:
        g = b.group("inference", inf.nodes, gpn)
        slots["inference"] = Slot(g.index, 0, g.nodes, tuple(range(inf.gpus_per_node or gpn)))
    return slots
