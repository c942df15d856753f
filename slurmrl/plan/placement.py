"""Where GPU components go: het groups, and a run of nodes plus GPU positions for each. Here: the trainer's
nodes, or the one node colocated RL gives trainer and inference; each engine places its own servers after
them (``slurmrl.plan.engines``: its ``place``)."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan.context import Context
from slurmrl.plan.spec import Slot
from slurmrl.recipe.recipe import Recipe


def colocated(ctx: Context) -> dict[str, Slot]:
    """Trainer and inference on one node: GPUs split between them, or the same GPUs shared."""
    r, gpn = ctx.r, ctx.r.slurm.gpus_per_node
    g = ctx.group("rl", 1, gpn)
    inf, tr = ctx.inference, ctx.trainer
    if r.placement.share_gpus:
        n = inf.gpus_per_node or gpn
        return {
            "inference": Slot(g.index, 0, 1, tuple(range(n)), shared=True),
            "trainer": Slot(g.index, 0, 1, tuple(range(tr.gpus_per_node or n)), shared=True),
        }
    assert inf.gpus_per_node is not None, "colocated without share_gpus names it (rules.check_placement)"
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


def server_names(r: Recipe) -> tuple[str, ...]:
    """The components of the policy's inference servers (and their slots' names)."""
    assert r.inference is not None, "asked only for a recipe with [inference]"
    return ("prefill", "decode") if r.inference.mode == "pd" else ("inference",)


def layout(ctx: Context) -> None:
    """The trainer's nodes, or the one node colocated RL gives trainer and inference."""
    r, gpn = ctx.r, ctx.r.slurm.gpus_per_node
    if r.placement.colocate:
        ctx.slots.update(colocated(ctx))
    elif r.trainer is not None:
        g = ctx.group("trainer", r.trainer.nodes, gpn)
        ctx.slots["trainer"] = Slot(g.index, 0, g.nodes, tuple(range(r.trainer.gpus_per_node or gpn)))
