"""The vLLM engine family: the policy's vLLM servers (replicas, wide-EP, prefill/decode), and what
fronts them (vllm-router and its pools: ``slurmrl.plan.services``; the Mooncake store: ``mooncake``).

Everything vLLM's planning needs lives in this package: its recipe rules (``rules``; a LoRA policy's,
``lora``), where its servers go (``placement``), their shape and command line (``servers``), vLLM's
flags (``flags``, which Dynamo's ``dynamo.vllm`` workers and the judge's servers speak too) and the
Mooncake store (``mooncake``). This module is the engine protocol (``slurmrl.plan.engines.base.Engine``).
"""

from __future__ import annotations

from slurmrl.plan import services
from slurmrl.plan.context import Context
from slurmrl.plan.engines.base import serves_backend
from slurmrl.plan.engines.vllm import lora, mooncake, placement, rules
from slurmrl.plan.engines.vllm.section import section
from slurmrl.plan.engines.vllm.servers import server_shape, servers
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.vllm import VllmInference

name = "vllm"
leftover_check = False
KV_CONNECTOR_FLAG = {"NixlConnector": "nixl", "MooncakeConnector": "mooncake"}  # vllm-router: nixl, mooncake, moriio


def check(r: Recipe) -> None:
    """vLLM's own rules beyond every recipe's (``slurmrl.plan.rules``): its section's
    (``rules``, the router's), and a LoRA policy its servers hot-load."""
    lora.check(r)
    if isinstance(r.inference, VllmInference):
        rules.check(r, r.inference)


def resolve(r: Recipe) -> Recipe:
    """A LoRA policy's ``inference.max_lora_rank`` where the recipe leaves it out (``lora.apply``)."""
    return lora.apply(r)


def serves(r: Recipe) -> bool:
    return serves_backend(r, name)


def place(ctx: Context) -> None:
    """The servers' het groups (or prefill's and decode's), after the trainer's (``placement``)."""
    placement.inference(ctx)


def build(ctx: Context) -> None:
    """The servers (sized first: the router runs in front of more than one), then the Mooncake store
    and the router."""
    inf = section(ctx)
    if inf.mode == "pd":
        specs = {role: getattr(inf, role) for role in ("prefill", "decode")}
        shapes = {role: server_shape(ctx, ctx.slots[role], s.tp, s.dp, f"inference.{role}", s.nodes_per_worker)
                  for role, s in specs.items()}
    else:
        shapes = {"inference": server_shape(ctx, ctx.slots["inference"], inf.tp, inf.dp, "inference")}
    routed = services.router_enabled(inf, sum(ctx.slots[n].nodes * s.per_node for n, s in shapes.items()))
    if inf.mode == "pd":
        per_node = {role: shape.per_node for role, shape in shapes.items()}
        first = 0
        for role, spec in specs.items():
            others = sum(per_node.values()) - per_node[role] if inf.share_nodes else 0
            servers(ctx, role, ctx.slots[role], shapes[role], spec.tp, spec.extra_args, spec.env, role,
                    spec.expert_parallel, routed, first_index=first, neighbours=others)
            weight_ranks(ctx, role, spec.tp, spec.dp)
            if inf.share_nodes:
                first += per_node[role]
    else:
        ep = inf.expert_parallel if inf.expert_parallel is not None else inf.mode == "wide_ep"
        servers(ctx, "inference", ctx.slots["inference"], shapes["inference"], inf.tp, [], {}, None, ep, routed)
        weight_ranks(ctx, "inference", inf.tp, inf.dp)
    mooncake.store(ctx)
    services.router(ctx, routed, pd_pools=pd_pools(inf) if inf.mode == "pd" else (), check=rules.check_events,
                    kv_connector=KV_CONNECTOR_FLAG.get(inf.kv_connector) if inf.mode == "pd" else None)


def weight_ranks(ctx: Context, name: str, tp: int, dp: int) -> None:
    """How many worker processes each server of component ``name`` has: each joins a weight broadcast
    (every TP/DP rank; a CPU node: the parallel layout alone, ``tp`` x ``dp``)."""
    spec = ctx.spec(name)
    leads = sum(1 for i in spec.instances if "http" in i.ports)
    gpus = sum(len(i.gpus) for i in spec.instances)
    ctx.weight_ranks[name] = gpus // leads if gpus else tp * dp


def pd_pools(inf: VllmInference) -> tuple[str, ...]:
    """The router's prelude lines that list its P/D pools from the servers' URLs: with Mooncake, each
    prefill server's bootstrap port beside its URL (its HTTP port + the distance between the two blocks)."""
    if inf.kv_connector != "MooncakeConnector":
        prefill = 'for url in "${prefill[@]}"; do pools+=(--prefill "${url}"); done'
    else:
        prefill = ('for url in "${prefill[@]}"; do pools+=(--prefill "${url}" "$((${url##*:} + PORT_KV_0 - '
                   'PORT_SERVER_0))"); done')
    return (prefill, 'for url in "${decode[@]}"; do pools+=(--decode "${url}"); done')
