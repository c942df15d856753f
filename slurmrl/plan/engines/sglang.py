"""Plain SGLang servers (``inference.backend = "sglang"``): ``python -m sglang.launch_server``, one
per replica, behind vllm-router (``slurmrl.plan.services``) when there are several.

A server takes ``tp x dp`` GPUs (``tp`` with data-parallel attention). One larger than a node spans
``tp / GPUs-per-node`` whole nodes: the same command on each, ``--nnodes``, ``--node-rank`` from
``SLURM_NODEID`` and ``--dist-init-addr`` on the worker's first node, which alone serves HTTP.
SGLang takes its ZeroMQ ports from ``--dist-init-addr``'s port + 1..6 (0.5.23's ``PortArgs``), and
with data-parallel attention on one node from ``--port`` + 233 (outside the job's port block), so
the plan gives ``--dist-init-addr`` whenever either is used: the data-parallel RPC block's first
port (``dprpc_0``, the six after it free: such a server is alone on its nodes).
Readiness: ``/health`` on the first node (then one completion, when no router fronts it).
"""

from __future__ import annotations

from slurmrl import ports
from slurmrl.contract import env as job_env
from slurmrl.errors import UserError
from slurmrl.plan import parallel, router_rules, services, shell, vllm_rules
from slurmrl.plan.context import Context
from slurmrl.plan.engines.base import serves_backend
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.parallel import Parallelism, Slice
from slurmrl.plan.spec import Slot, Spec, Supervisor
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.sglang import SglangInference
from slurmrl.recipe.user_set import user_set

name = "sglang"
ENTRY = ("-m", "sglang.launch_server")
DIST_PORT = "dprpc_0"  # --dist-init-addr's port; SGLang uses the six after it too
DTYPES = {"auto": "auto", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}  # model.dtype -> --dtype
leftover_check = False


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
    if inf.mode == "pd":
        raise UserError("inference.mode", "SGLang's prefill/decode disaggregation is not built; use mode "
                        "'replicas', or backend 'vllm' for P/D")
    if inf.gpus_per_node == 0:
        raise UserError("inference.gpus_per_node", "SGLang servers take tp GPUs each; leave it out or give at least tp")
    if inf.enable_dp_attention and inf.tp % inf.dp:
        raise UserError("inference.dp", f"with enable_dp_attention, dp={inf.dp} must divide tp={inf.tp}")
    if "kv_aware" in router_rules.policies(inf).values():
        raise UserError("inference.router.policy", "kv_aware reads the servers' KV-cache events, which the plan "
                        "wires for vLLM's servers only; use cache_aware")
    if r.model.stage != "shared" and shape_of(r).span > 1:
        raise UserError("model.stage", "a node-local copy for a server spanning nodes is not built; use \"shared\"")
    vllm_rules.check_router_header(inf)


def section(r: Recipe) -> SglangInference:
    assert isinstance(r.inference, SglangInference), "planned only for [inference] with backend 'sglang'"
    return r.inference


def shape_of(r: Recipe) -> Slice:
    """Servers of tp x dp GPUs (tp with data-parallel attention) on the inference nodes."""
    inf = section(r)
    n = inf.gpus_per_node or r.slurm.gpus_per_node
    p = Parallelism("inference", inf.tp, 1 if inf.enable_dp_attention else inf.dp)
    span, per_gpus = parallel.worker_span(p, n, tp_spans=True)
    if span > 1:
        if p.dp > 1:
            raise UserError("inference.dp", "a server spanning nodes takes data parallelism as attention DP only "
                            "(enable_dp_attention = true)")
        parallel.whole_workers(p, inf.nodes, span)
        return Slice(span=span, per_node=1, gpus=per_gpus)
    per = parallel.per_node(p, n)
    if per > ports.MAX_LOCAL:
        raise UserError("inference.tp", f"{per} servers per node; at most {ports.MAX_LOCAL} are supported")
    if inf.enable_dp_attention and per > 1:
        raise UserError("inference.enable_dp_attention", f"{per} servers per node: SGLang takes seven ports from "
                        "--dist-init-addr for each, which the port table gives one server per node; use tp = the "
                        "node's GPUs")
    return Slice(span=1, per_node=per, gpus=p.size)


def server_args(ctx: Context, inf: SglangInference, shape: Slice) -> tuple[list[str], list[str], list[Arg]]:
    """(prelude, its variables, the launch_server arguments) of every server task."""
    r = ctx.r
    args: list[Arg] = ["--model-path", ctx.model_path(), "--served-model-name", r.model.served_model_name,
                       "--host", "0.0.0.0", "--port", Sh(sh="${port}"), "--tp-size", str(inf.tp)]
    if inf.dp > 1:
        args += ["--dp-size", str(inf.dp)]
    if inf.enable_dp_attention:
        args.append("--enable-dp-attention")
    if inf.mem_fraction_static is not None:
        args += ["--mem-fraction-static", repr(inf.mem_fraction_static)]
    if r.model.max_model_len is not None:
        args += ["--context-length", str(r.model.max_model_len)]
    if user_set(r.model, "dtype"):
        args += ["--dtype", DTYPES[r.model.dtype]]
    if r.model.trust_remote_code:
        args.append("--trust-remote-code")
    prelude = [shell.HOST_LINE, f"port={shell.per_task('server')}"]
    names = ["host", "port"]
    dist = shell.var(DIST_PORT).sh
    if shape.span > 1:
        slot = ctx.slots["inference"]
        first = f"{slot.first_node} + " if slot.first_node else ""
        prelude += [f'read -ra nodes <<<"${{{job_env.nodes_of_group(slot.group)}}}"',
                    f"leader=${{nodes[{first}SLURM_NODEID / {shape.span} * {shape.span}]}}  # this server's first node",
                    f"rank=$((SLURM_NODEID % {shape.span}))",
                    f'ready={shell.url("http", Sh(sh="${port}")).sh}',
                    "((rank == 0)) || ready=started  # serves no API"]
        names += ["nodes", "leader", "rank", "ready"]
        args += ["--nnodes", str(shape.span), "--node-rank", Sh(sh="${rank}"), "--dist-init-addr",
                 Sh(sh=f"${{leader}}:{dist}")]
    elif inf.enable_dp_attention:  # else SGLang takes its ports at --port + 233, outside the job's block
        args += ["--dist-init-addr", Sh(sh=f"127.0.0.1:{dist}")]
    return prelude, names, args + list(inf.extra_args)


# ---- the engine protocol (slurmrl.plan.engines.base.Engine) -------------------------------------
def place(ctx: Context) -> None:
    """The servers' het group, after the trainer's (none: kind inference)."""
    inf = section(ctx.r)
    g = ctx.group("inference", inf.nodes, ctx.r.slurm.gpus_per_node)
    ctx.slots["inference"] = Slot(g.index, 0, g.nodes, tuple(range(inf.gpus_per_node or ctx.r.slurm.gpus_per_node)))


def build(ctx: Context) -> None:
    """The servers, then vllm-router in front of more than one."""
    r, inf = ctx.r, section(ctx.r)
    slot, shape = ctx.slots["inference"], shape_of(ctx.r)
    routed = services.router_enabled(inf, slot.nodes // shape.span * shape.per_node)
    prelude, names, args = server_args(ctx, inf, shape)
    multi = shape.span > 1
    instances = tuple(
        Instance(rank=i, node=node, local=local, gpus=gpus,
                 ports={"http": f"server_{local}", **({"dist": DIST_PORT} if multi or inf.enable_dp_attention else {})}
                 if shape.leads(node) else {})
        for i, (node, local, gpus) in enumerate(shape.tasks(slot.gpus, slot.nodes)))
    ctx.add(Spec(
        name="inference", role="inference", group=slot.group, slot=slot, first_node=slot.first_node,
        nodes=slot.nodes, tasks_per_node=shape.per_node, gpus_per_node=len(slot.gpus), stage=2,
        main=ctx.serving_is_main, fail_fast=False, instances=instances, reads_model=True,
        health=Health(kind="http", ports=tuple(f"server_{i}" for i in range(shape.per_node)),
                      nodes_per_server=shape.span, timeout=inf.startup_timeout, urls_var="URLS_INFERENCE"),
        task=ctx.task(
            Supervisor("inference", gpus=shell.gpu_slice(0, shape.gpus, not multi),
                       ready=Sh(sh="${ready}") if multi else shell.url("http", Sh(sh="${port}")),
                       ready_completion=None if routed else r.model.served_model_name, fail_on=tuple(inf.fail_on)),
            prelude=[*shell.declare(*names), *prelude], env=sorted(inf.env.items()),
            command=(*ctx.py, *ENTRY, *args),
        ),
    ))
    services.router(ctx, routed)
