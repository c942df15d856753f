"""Where GPU components go: het groups, and a run of nodes plus GPU positions for each."""

from __future__ import annotations

import math

from slurmrl.errors import UserError
from slurmrl.plan.context import Context, Group
from slurmrl.plan.spec import Slot
from slurmrl.recipe.schema import Recipe


def colocated(ctx: Context) -> dict[str, Slot]:
    """Trainer and inference on one node: GPUs split between them, or the same GPUs shared."""
    r, gpn = ctx.r, ctx.r.slurm.gpus_per_node
    g = ctx.group("rl", 1, gpn)
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


def worker_span(field: str, tp: int, dp: int, gpn: int, span: int | None) -> tuple[int, int]:
    """(nodes per worker, GPUs per node of a worker) for one worker of tp x dp GPUs on nodes of
    ``gpn`` GPUs: one node when it fits, else whole nodes (or ``span`` nodes when given)."""
    size = tp * dp
    if tp > gpn:
        raise UserError(f"{field}.tp", f"tp={tp} needs more than the {gpn} GPUs of one node")
    if span is None:
        if size <= gpn:
            return 1, size
        if size % gpn:
            raise UserError(
                f"{field}.dp",
                f"a worker of tp x dp = {size} GPUs spans whole nodes of {gpn} GPUs; make tp x dp a multiple of {gpn}",
            )
        return size // gpn, gpn
    if size % span or (size // span) % tp or size // span > gpn:
        raise UserError(
            f"{field}.nodes_per_worker",
            f"{span} nodes cannot hold a worker of tp x dp = {size} GPUs evenly (whole engines of tp={tp}, "
            f"at most {gpn} GPUs per node)",
        )
    return span, size // span


def pd_role(ctx: Context, role: str, group: Group | None = None, first_gpu: int = 0) -> Slot:
    """Nodes of one side of prefill/decode: as few as fit its workers, unless given."""
    gpn = ctx.r.slurm.gpus_per_node
    spec = getattr(ctx.r.inference, role)
    field = f"inference.{role}"
    span, per = worker_span(field, spec.tp, spec.dp, gpn - first_gpu, spec.nodes_per_worker)
    if span > 1:
        nodes = spec.nodes or spec.replicas * span
        if nodes != spec.replicas * span:
            raise UserError(
                f"{field}.nodes",
                f"{spec.replicas} workers x {span} nodes each need {spec.replicas * span} nodes, not {nodes}",
            )
        gpus = per
    else:
        nodes = spec.nodes or (group.nodes if group is not None else math.ceil(spec.replicas * per / gpn))
        if spec.replicas % nodes:
            raise UserError(
                f"{field}.replicas",
                f"{spec.replicas} workers do not spread evenly over {nodes} nodes; use a multiple of {nodes}",
            )
        gpus = spec.replicas // nodes * per
        if gpus > gpn - first_gpu:
            left = f"; {first_gpu} go to prefill" if first_gpu else ""
            raise UserError(
                f"{field}.nodes",
                f"{spec.replicas // nodes} workers x {per} GPUs per node need {gpus} GPUs; nodes have {gpn}{left}",
            )
    if group is None:
        group = ctx.group(role, nodes, gpn)
    elif nodes != group.nodes:
        raise UserError(
            f"{field}.nodes",
            f"with inference.share_nodes both roles run on the same nodes: decode needs {nodes}, prefill {group.nodes}",
        )
    return Slot(group.index, 0, nodes, tuple(range(first_gpu, first_gpu + gpus)), shared=first_gpu > 0)


def pd_slots(ctx: Context) -> dict[str, Slot]:
    """Prefill and decode each on their own nodes, or sharing nodes (prefill's GPUs first)."""
    if not ctx.r.inference.share_nodes:
        return {role: pd_role(ctx, role) for role in ("prefill", "decode")}
    prefill = pd_role(ctx, "prefill")
    group = ctx.groups[prefill.group]
    group.name = "pd"
    decode = pd_role(ctx, "decode", group, first_gpu=len(prefill.gpus))
    return {"prefill": Slot(prefill.group, 0, prefill.nodes, prefill.gpus, shared=True), "decode": decode}


def server_names(r: Recipe) -> tuple[str, ...]:
    """The components of the policy's inference servers (and their slots' names)."""
    return ("prefill", "decode") if r.inference.mode == "pd" else ("inference",)


def layout(ctx: Context) -> None:
    """The trainer's nodes, or the one node colocated RL gives trainer and inference."""
    r, gpn = ctx.r, ctx.r.slurm.gpus_per_node
    if r.placement.colocate:
        ctx.slots.update(colocated(ctx))
    elif r.trainer is not None:
        g = ctx.group("trainer", r.trainer.nodes, gpn)
        ctx.slots["trainer"] = Slot(g.index, 0, g.nodes, tuple(range(r.trainer.gpus_per_node or gpn)))


def inference(ctx: Context) -> None:
    """The inference servers' nodes (after the trainer's), unless colocated RL placed them."""
    r, gpn = ctx.r, ctx.r.slurm.gpus_per_node
    inf = r.inference
    if "inference" in ctx.slots:
        return
    if inf.mode == "pd":
        ctx.slots.update(pd_slots(ctx))
    else:
        g = ctx.group("inference", inf.nodes, gpn)
        # a judge on these nodes takes GPUs after inference's: each step asks for all, narrows to its slice
        shared = r.judge is not None and r.judge.placement == "inference"
        ctx.slots["inference"] = Slot(g.index, 0, g.nodes, tuple(range(inf.gpus_per_node or gpn)), shared=shared)
