"""Where the vLLM engine's servers go: their het group after the trainer's (``inference``), or prefill's
and decode's, each on its own nodes or sharing nodes (``pd_slots``); colocated RL's one node is
``slurmrl.plan.placement``'s."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan import parallel
from slurmrl.plan.context import Context, Group
from slurmrl.plan.engines.vllm.section import section
from slurmrl.plan.parallel import Parallelism
from slurmrl.plan.spec import Slot


def pd_role(ctx: Context, role: str, group: Group | None = None, first_gpu: int = 0) -> Slot:
    """Nodes of one side of prefill/decode: as few as fit its workers, unless given."""
    gpn = ctx.r.slurm.gpus_per_node
    spec = getattr(section(ctx), role)
    field = f"inference.{role}"
    p = Parallelism(field, spec.tp, spec.dp)
    span, per = parallel.worker_span(p, gpn - first_gpu, spec.nodes_per_worker)
    left = f"; {first_gpu} go to prefill" if first_gpu else ""
    shared = group.nodes if group is not None and span == 1 else None  # decode on prefill's nodes
    nodes, gpus = parallel.spread(p, spec.replicas, span, per, gpn, spec.nodes or shared, first_gpu, left)
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
    if not section(ctx).share_nodes:
        return {role: pd_role(ctx, role) for role in ("prefill", "decode")}
    prefill = pd_role(ctx, "prefill")
    group = ctx.groups[prefill.group]
    group.name = "pd"
    decode = pd_role(ctx, "decode", group, first_gpu=len(prefill.gpus))
    return {"prefill": Slot(prefill.group, 0, prefill.nodes, prefill.gpus, shared=True), "decode": decode}


def inference(ctx: Context) -> None:
    """The inference servers' nodes (after the trainer's), unless colocated RL placed them."""
    r, gpn = ctx.r, ctx.r.slurm.gpus_per_node
    inf = ctx.inference
    if "inference" in ctx.slots:
        return
    if inf.mode == "pd":
        ctx.slots.update(pd_slots(ctx))
    else:
        g = ctx.group("inference", inf.nodes, gpn)
        # a judge on these nodes takes GPUs after inference's: each step asks for all, narrows to its slice
        shared = r.judge is not None and r.judge.placement == "inference"
        ctx.slots["inference"] = Slot(g.index, 0, g.nodes, tuple(range(inf.gpus_per_node or gpn)), shared=shared)
