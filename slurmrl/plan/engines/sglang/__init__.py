"""Plain SGLang servers (``inference.backend = "sglang"``): ``python -m sglang.launch_server``, one
per replica, behind vllm-router (``slurmrl.plan.services``) when there are several; mode ``pd``:
prefill and decode servers behind sglang-router (``pd``).

A server's shape on its nodes and its flags: ``launch``. A server spanning nodes runs the
same command on each; only its first node serves HTTP.
Readiness: ``/health`` on the first node (then one completion, when no router fronts it).
"""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan import router_rules, services
from slurmrl.plan.context import Context
from slurmrl.plan.engines.base import serves_backend
from slurmrl.plan.engines.sglang import launch
from slurmrl.plan.engines.sglang import pd as sglang_pd
from slurmrl.plan.model import Instance
from slurmrl.plan.parallel import Slice
from slurmrl.plan.spec import Slot
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.sglang import SglangInference

name = "sglang"
leftover_check = False


def resolve(r: Recipe) -> Recipe:
    return r


def serves(r: Recipe) -> bool:
    return serves_backend(r, name)


def check(r: Recipe) -> None:
    """One line naming the field for every combination this plan of SGLang cannot honour."""
    inf = r.inference
    if not isinstance(inf, SglangInference):
        return
    if r.kind != "inference":
        raise UserError("inference.backend", f"SGLang serves kind 'inference' only (kind is {r.kind!r}): RL reloads "
                        "weights through vLLM's admin endpoints")
    if inf.auth != "none":
        raise UserError("inference.auth", "SGLang takes an API key only as --api-key on its command line, which "
                        "every user of the node reads (vLLM's servers read the secret from a file): set auth = "
                        "\"none\" and keep its ports off networks you do not trust")
    if inf.gpus_per_node == 0:
        raise UserError("inference.gpus_per_node", "SGLang servers take tp GPUs each; leave it out or give at least tp")
    if inf.mode == "pd":
        sglang_pd.check(r, inf)
        return
    for field in ("prefill", "decode", "transfer_backend"):
        if getattr(inf, field) is not None:
            raise UserError(f"inference.{field}", "only mode 'pd' reads it")
    if inf.enable_dp_attention and inf.tp % inf.dp:
        raise UserError("inference.dp", f"with enable_dp_attention, dp={inf.dp} must divide tp={inf.tp}")
    if "kv_aware" in router_rules.policies(inf).values():
        raise UserError("inference.router.policy", "kv_aware reads the servers' KV-cache events, which the plan "
                        "wires for vLLM's servers only; use cache_aware")
    if r.model.stage != "shared" and shape_of(r).span > 1:
        raise UserError("model.stage", "a node-local copy for a server spanning nodes is not built; use \"shared\"")
    router_rules.check_header(inf)


def section(r: Recipe) -> SglangInference:
    assert isinstance(r.inference, SglangInference), "planned only for [inference] with backend 'sglang'"
    return r.inference


def shape_of(r: Recipe) -> Slice:
    """Servers of tp x dp GPUs (tp with data-parallel attention) on the inference nodes."""
    inf = section(r)
    p = launch.parallelism("inference", inf.tp, inf.dp, inf.enable_dp_attention)
    return launch.replicas_slice(p, inf.nodes, inf.gpus_per_node or r.slurm.gpus_per_node, inf.enable_dp_attention,
                                 "inference.enable_dp_attention")


# ---- the engine protocol (slurmrl.plan.engines.base.Engine) -------------------------------------
def place(ctx: Context) -> None:
    """The servers' het group (one per role in mode ``pd``), after the trainer's (none: kind inference)."""
    inf = section(ctx.r)
    if inf.mode == "pd":
        sglang_pd.place(ctx)
        return
    g = ctx.group("inference", inf.nodes, ctx.r.slurm.gpus_per_node)
    ctx.slots["inference"] = Slot(g.index, 0, g.nodes, tuple(range(inf.gpus_per_node or ctx.r.slurm.gpus_per_node)))


def build(ctx: Context) -> None:
    """The servers, then vllm-router in front of more than one (mode ``pd``: ``pd``)."""
    inf = section(ctx.r)
    if inf.mode == "pd":
        sglang_pd.build(ctx)
        return
    slot, shape = ctx.slots["inference"], shape_of(ctx.r)
    routed = services.router_enabled(inf, slot.nodes // shape.span * shape.per_node)
    prelude, names, args = launch.server_args(ctx, inf, slot, shape, inf.tp, inf.dp, inf.enable_dp_attention)
    instances = tuple(
        Instance(rank=i, node=node, local=local, gpus=gpus,
                 ports={"http": f"server_{local}", **launch.dist_ports(shape, inf.enable_dp_attention)}
                 if shape.leads(node) else {})
        for i, (node, local, gpus) in enumerate(shape.tasks(slot.gpus, slot.nodes)))
    launch.servers(ctx, inf, "inference", slot, shape, args + list(inf.extra_args), prelude, names, dict(inf.env), instances,
            completion=not routed)
    services.router(ctx, routed)
