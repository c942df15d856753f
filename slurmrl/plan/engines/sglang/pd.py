"""SGLang's prefill/decode disaggregation on its own (``backend = "sglang"``, ``mode = "pd"``):
prefill and decode ``sglang.launch_server`` servers, each role its own het group, and sglang-router
(``python -m sglang_router.launch_router --pd-disaggregation``) on the prefill group's first node,
which sends each request to a prefill and a decode server and tells both the prefill server's
bootstrap address (``--prefill URL BOOTSTRAP_PORT``), as srt-slurm's SGLang frontend does.

Servers: ``--disaggregation-mode prefill|decode`` and ``--disaggregation-transfer-backend`` (nixl or
mooncake, the recipe names one), a prefill server's bootstrap server on its ``kv_<k>`` port, and
``--skip-server-warmup`` (SGLang's own warmup of a P/D server waits for a peer that only the
router pairs; the router's completion is the readiness check instead). Readiness: every server's
``/health``, then one completion through the router (sglang-router lists its workers at ``/workers``,
not vllm-router's ``/list_workers``, so the count is not asked).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl import ports
from slurmrl.errors import UserError
from slurmrl.plan import router_rules, shell
from slurmrl.plan.context import Context
from slurmrl.plan.engines.sglang import launch
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.parallel import Slice
from slurmrl.plan.spec import Slot, Spec, Supervisor, restart_of
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.sglang import SglangInference, SglangRole
from slurmrl.recipe.user_set import user_set

ROUTER = ("-m", "sglang_router.launch_router")
ROUTER_CPUS = 2
ROUTER_HEALTH_INTERVAL_S = 5
# sglang-router 0.3.2's --prefill-policy / --decode-policy choices the plan renders (`manual` routes by a
# request header, `bucket` is prefill-only): each as vllm-router's policy of the same name
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
DEFAULT_POLICY = "cache_aware"  # sglang-router's; [inference.router]'s default is vllm-router's consistent_hash
NOT_PD = ("tp", "dp", "enable_dp_attention", "nodes")  # [inference] fields mode 'pd' sizes per role


@dataclass(frozen=True)
class PdRole:
    name: str  # "prefill" or "decode": its component, het group and --disaggregation-mode
    spec: SglangRole
    shape: Slice
    nodes: int


def roles(r: Recipe, inf: SglangInference) -> list[PdRole]:
    out = []
    for name in ("prefill", "decode"):
        spec = getattr(inf, name)
        assert spec is not None, "mode 'pd' has both roles (check)"
        field = f"inference.{name}"
        p = launch.parallelism(field, spec.tp, spec.dp, spec.enable_dp_attention)
        shape, nodes = launch.role_slice(p, spec.replicas, spec.nodes, r.slurm.gpus_per_node, spec.enable_dp_attention,
                                         f"{field}.enable_dp_attention")
        out.append(PdRole(name, spec, shape, nodes))
    return out


def check(r: Recipe, inf: SglangInference) -> None:
    """One line naming the field for every P/D setting this plan cannot honour."""
    for name in ("prefill", "decode"):
        spec = getattr(inf, name)
        if spec is None:
            raise UserError(f"inference.{name}", "mode 'pd' needs [inference.prefill] and [inference.decode]")
        if user_set(spec, "expert_parallel"):
            raise UserError(f"inference.{name}.expert_parallel", "a vLLM flag; SGLang's expert parallelism is "
                            "--ep-size in the role's extra_args")
    if inf.transfer_backend is None:
        raise UserError("inference.transfer_backend", "SGLang's P/D moves KV with a transfer backend that needs "
                        f"the nodes' GPUs and NICs: name one ({' or '.join(launch.TRANSFER_BACKENDS)})")
    for field in NOT_PD:
        if user_set(inf, field):
            raise UserError(f"inference.{field}", f"mode 'pd' sizes each role: set inference.prefill.{field} and "
                            f"inference.decode.{field}")
    if inf.router.enabled is False:
        raise UserError("inference.router.enabled", "SGLang's P/D needs sglang-router: it pairs each request's "
                        "prefill and decode servers")
    check_router(inf)
    pd = roles(r, inf)
    if r.model.stage != "shared" and any(role.shape.span > 1 for role in pd):
        raise UserError("model.stage", "a node-local copy for a server spanning nodes is not built; use \"shared\"")


def policies(inf: SglangInference) -> dict[str, str]:
    """Each pool's policy: the role's, else ``policy`` when set, else sglang-router's default."""
    r = inf.router
    base = r.policy if user_set(r, "policy") else DEFAULT_POLICY
    return {"prefill": r.prefill_policy or base, "decode": r.decode_policy or base}


def check_router(inf: SglangInference) -> None:
    """sglang-router's policies, and the options of [inference.router] it reads (named as vllm-router's)."""
    r = inf.router
    for pool, policy in policies(inf).items():
        if policy not in ROUTER_POLICIES:
            field = f"{pool}_policy" if getattr(r, f"{pool}_policy") else "policy"
            raise UserError(f"inference.router.{field}", f"sglang-router routes P/D by {', '.join(ROUTER_POLICIES)}; "
                            f"{policy!r} is vllm-router's")
    if r.prefill_policy and r.decode_policy and user_set(r, "policy"):
        raise UserError("inference.router.policy", "both prefill_policy and decode_policy are set: it is not used")
    for name in type(r).model_fields:
        if name in ("enabled", "policy", "prefill_policy", "decode_policy", "extra_args") or not user_set(r, name):
            continue
        if name in router_rules.CACHE_AWARE and "cache_aware" in policies(inf).values():
            continue
        if name in router_rules.ANY_POLICY:
            continue
        why = ("only the cache_aware policy reads it" if name in router_rules.CACHE_AWARE
               else "sglang-router has no such option")
        raise UserError(f"inference.router.{name}", f"{why}; leave it out")


def section(r: Recipe) -> SglangInference:
    assert isinstance(r.inference, SglangInference), "planned only for [inference] with backend 'sglang'"
    return r.inference


def place(ctx: Context) -> None:
    """A het group per role, the prefill group first (it holds the router)."""
    for role in roles(ctx.r, section(ctx.r)):
        g = ctx.group(role.name, role.nodes, ctx.r.slurm.gpus_per_node)
        ctx.slots[role.name] = Slot(g.index, 0, g.nodes, tuple(range(role.shape.gpus_per_node)))


def build(ctx: Context) -> None:
    """Prefill and decode servers, then sglang-router in front of them."""
    inf = section(ctx.r)
    launch.untried(ctx, inf.transfer_backend)
    for role in roles(ctx.r, inf):
        slot, shape, spec = ctx.slots[role.name], role.shape, role.spec
        prelude, names, args = launch.server_args(ctx, inf, slot, shape, spec.tp, spec.dp, spec.enable_dp_attention)
        args += [*launch.disaggregation(role.name, inf.transfer_backend), "--skip-server-warmup",
                 *inf.extra_args, *spec.extra_args]
        instances = tuple(
            Instance(rank=i, node=node, local=local, gpus=gpus,
                     ports={"http": f"server_{local}", **launch.dist_ports(shape, spec.enable_dp_attention),
                            **launch.bootstrap_ports(role.name, shape, node, local)} if shape.leads(node) else {})
            for i, (node, local, gpus) in enumerate(shape.tasks(slot.gpus, slot.nodes)))
        launch.servers(ctx, inf, role.name, slot, shape, args, prelude, names, {**inf.env, **spec.env}, instances,
                       completion=False)
    router(ctx, inf)


def router(ctx: Context, inf: SglangInference) -> None:
    """sglang-router on the prefill group's first node: each prefill server with its bootstrap port
    (its HTTP port + the distance between the two port blocks), each decode server."""
    head = ctx.groups[ctx.slots["prefill"].group]
    ctx.reserve(head, 0, ROUTER_CPUS, "the router")
    port = shell.var("router")
    policy = policies(inf)
    boot = f"{ports.shell_var(launch.BOOTSTRAP_BLOCK + '_0')} - {ports.shell_var('server_0')}"
    prelude = [
        *shell.declare("host", "url", arrays=("prefill", "decode", "pools")),
        shell.HOST_LINE,
        "pools=()",
        'read -ra prefill <<<"${URLS_PREFILL}"',
        'read -ra decode <<<"${URLS_DECODE}"',
        f'for url in "${{prefill[@]}}"; do pools+=(--prefill "${{url}}" "$((${{url##*:}} + {boot}))"); done',
        'for url in "${decode[@]}"; do pools+=(--decode "${url}"); done',
    ]
    args: list[Arg] = [
        "--host", "0.0.0.0", "--port", port,
        "--prometheus-host", "0.0.0.0", "--prometheus-port", shell.var("router_metrics"),
        "--health-check-interval-secs", str(ROUTER_HEALTH_INTERVAL_S), "--health-failure-threshold", "1",
        "--worker-startup-timeout-secs", str(inf.startup_timeout),
        "--pd-disaggregation", "--prefill-policy", policy["prefill"], "--decode-policy", policy["decode"],
        *router_rules.option_args(inf), Sh(sh="${pools[@]}"), *inf.router.extra_args,
    ]
    ctx.add(Spec(
        name="router", role="router", group=head.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=ROUTER_CPUS, gpus_per_node=0, stage=3,
        health=Health(kind="http", ports=("router",), first_node_only=True, timeout=300, urls_var="URLS_ROUTER"),
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={"http": "router", "metrics": "router_metrics"}),),
        task=ctx.task(
            # ready means serving: one completion through the router (prefill, KV transfer, decode)
            Supervisor("router", ready=shell.url("http", port), ready_completion=ctx.r.model.served_model_name,
                       **restart_of(inf.router)),
            prelude=prelude, command=(*ctx.py, *ROUTER, *args),
        ),
    ))
