"""The policy's vLLM servers (replicas, wide-EP, prefill/decode): how many per node, their GPUs,
ports, readiness and command line; the flags themselves are spelled in ``flags``."""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl import ports
from slurmrl.contract.weight_sync import Broadcast, Filesystem
from slurmrl.errors import UserError
from slurmrl.plan import parallel, router_rules, shell
from slurmrl.plan.context import Context
from slurmrl.plan.engines.vllm import flags
from slurmrl.plan.engines.vllm.section import section
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.parallel import Parallelism, Slice
from slurmrl.plan.placement import server_names
from slurmrl.plan.spec import Slot, Spec, Supervisor, restart_of
from slurmrl.recipe.vllm import VllmInference


@dataclass(frozen=True)
class Shape(Slice):
    """How one inference component's GPUs form workers (vLLM deployments)."""

    dp: int  # data-parallel ranks per worker
    dp_local: int  # data-parallel ranks per task


def server_shape(ctx: Context, slot: Slot, tp: int, dp: int, where: str, span: int | None = None) -> Shape:
    """Workers of tp x dp GPUs on this slot, or a UserError naming the field."""
    inf, n = section(ctx), len(slot.gpus)
    if inf.mode == "wide_ep" and dp == 1:  # one deployment over every node
        dp = parallel.per_node(Parallelism("inference", tp, by_tp=True), n) * slot.nodes
    p = Parallelism(where, tp, dp)
    if span is None:
        span, _ = parallel.worker_span(p, n)
    if span > 1:
        if n % tp or p.size != n * span:
            raise UserError(f"{where}.tp", f"tp={tp} does not divide the {n} inference GPUs per node")
        parallel.whole_workers(p, slot.nodes, span)
        return Shape(span=span, per_node=1, gpus=n, dp=dp, dp_local=n // tp)
    per = parallel.per_node(p, n)
    if per > ports.MAX_LOCAL:
        raise UserError(f"{where}.tp", f"{per} servers per node; at most {ports.MAX_LOCAL} are supported")
    return Shape(span=1, per_node=per, gpus=p.size, dp=dp, dp_local=dp)


def vllm_env(ctx: Context, role_env: dict) -> list:
    r, inf = ctx.r, section(ctx)
    env: list = sorted({**inf.env, **role_env}.items())
    admin = inf.admin_endpoints if inf.admin_endpoints is not None else r.kind == "rl"
    if admin:
        env.append(("VLLM_SERVER_DEV_MODE", "1"))  # pause / reload_weights / resume endpoints
    if inf.max_lora_rank:
        env.append(("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"))
    if inf.return_routed_experts:  # vLLM 0.32 returns routed experts from its V2 model runner only
        env.append(("VLLM_USE_V2_MODEL_RUNNER", "1"))
    return env


def server_instances(inf: VllmInference, slot: Slot, shape: Shape, pd_role: str | None, first_index: int,
                     events: bool) -> tuple[Instance, ...]:
    """Each task of a server component and the ports it listens on: HTTP and the data-parallel RPC
    on a worker's first node, its KV ports (Mooncake's bootstrap, NIXL's side channels), the KV
    events the router subscribes to."""
    instances: list[Instance] = []
    for node, local, gpus in shape.tasks(slot.gpus, slot.nodes):
        lead = shape.leads(node)
        index = first_index + local
        iports = {"http": f"server_{index}"} if lead else {}
        if lead and shape.dp > 1:
            iports["dp_rpc"] = f"dprpc_{index}"
        if pd_role == "prefill" and inf.kv_connector == "MooncakeConnector" and lead:
            iports["kv"] = f"kv_{index}"  # the Mooncake bootstrap port
        elif pd_role and inf.kv_connector == "NixlConnector":  # NIXL: one side-channel port per engine (data-parallel rank) of the task
            iports.update({f"kv{k or ''}": f"nixl_{gpus[0] + k}" for k in range(shape.dp_local)})
        if events and "http" in iports:  # the router subscribes to it (claimed with the job's ports)
            iports["kv_events"] = f"kv_events_{index}"
        instances.append(Instance(rank=len(instances), node=node, local=local, gpus=gpus, ports=iports))
    return tuple(instances)


def servers(ctx: Context, name: str, slot: Slot, shape: Shape, tp: int, extra: list[str], role_env: dict,
            pd_role: str | None, expert_parallel: bool, routed: bool, first_index: int = 0,
            neighbours: int = 0) -> None:
    """One inference component of workers of ``shape`` on ``slot``: their vLLM command line, once,
    with per-task values in the prelude. ``first_index``: the first per-node port index it may use,
    ``neighbours``: servers of other components on the same nodes (P/D sharing nodes); ``routed``:
    vllm-router fronts it."""
    r, inf = ctx.r, section(ctx)
    if r.placement.share_gpus and inf.gpu_memory_utilization is None:
        inf = inf.model_copy(update={"gpu_memory_utilization": 0.45})
        ctx.warnings.append("inference.gpu_memory_utilization set to 0.45: the trainer shares the GPU")
    hybrid = r.placement.colocate == "hybrid"
    if hybrid:  # sleep mode's allocator (cumem) is CUDA's: the CPU build refuses it
        ctx.warnings.append("placement.colocate = \"hybrid\" starts vLLM with --enable-sleep-mode, which needs CUDA "
                            "GPUs on the node (vLLM's CPU build and CPU-only partitions refuse it)")
    multi = shape.span > 1
    prelude = [shell.HOST_LINE, f"port={shell.per_task('server', first_index)}"]
    names = ["host", "port"]
    args = [*flags.common_args(r.model, inf, tp, ctx.model_path()), *flags.otlp_args(r.env, inf.env, dict(role_env))]
    if hybrid:  # the orchestrator puts it to sleep while the trainer steps (slurmrl.runtime.orchestrator.hybrid)
        args.append("--enable-sleep-mode")
    env = vllm_env(ctx, role_env)
    if "VLLM_PORT" not in dict(env):
        env.append(flags.internal_ports(first_index))
    ready: Arg = shell.url("http", flags.PORT)
    if multi:
        p, a = flags.multi_node(shape.dp, shape.dp_local, shape.span, slot.group, slot.first_node, first_index)
        prelude += p + [f'ready={shell.url("http", flags.PORT).sh}', "((rank == 0)) || ready=started  # headless: serves no API"]
        names += ["nodes", "leader", "rank", "ready", "rank_args"]
        args += a
        ready = Sh(sh="${ready}")
    else:
        p, a = flags.local_dp(shape.dp, first_index)
        prelude += p
        names += ["dp_rpc"] if p else []
        args += a
    if expert_parallel:
        args.append("--enable-expert-parallel")
    sync = r.trainer.sync if r.kind == "rl" and r.trainer is not None else Filesystem()
    if isinstance(sync, Broadcast):
        args += flags.weight_transfer(sync)
        if sync.on_shared_gpu:  # the CUDA IPC handles travel pickled over HTTP (vLLM's HTTP client)
            env.append(("VLLM_ALLOW_INSECURE_SERIALIZATION", "1"))
    transfer = None
    if pd_role:
        p, transfer, e = flags.pd(inf, pd_role, slot.gpus[0], shape.gpus, first_index, multi)
        prelude += p
        names += [line.split("=")[0] for line in p]
        env += e
    args += flags.kv_events(inf, name)  # vllm-router's kv_aware policy reads them
    events = routed and router_rules.reads_events(inf, name)
    a, e = flags.offload(inf, shape.per_node + neighbours, ctx.slots[server_names(r)[0]].group, transfer)
    args += a + list(inf.extra_args) + list(extra)
    env += e
    instances = server_instances(inf, slot, shape, pd_role, first_index, events)
    health = Health(
        kind="http",
        ports=tuple(f"server_{first_index + i}" for i in range(shape.per_node)),
        first_node_only=inf.mode == "wide_ep" and shape.span == slot.nodes,
        nodes_per_server=shape.span,
        timeout=inf.startup_timeout,
        urls_var=f"URLS_{name.upper()}",
    )
    # ready means serving: a server no router fronts answers one completion first (a pooling server has none)
    completion = None if routed or flags.pooling(args) else r.model.served_model_name
    ctx.add(Spec(
        name=name, role="inference", group=slot.group, slot=slot, first_node=slot.first_node, nodes=slot.nodes,
        tasks_per_node=shape.per_node, gpus_per_node=len(slot.gpus), stage=2,
        # a server that dies is restarted in place (one spanning nodes: its tasks as a whole, --worker-tasks),
        # and in RL the others serve on (no kill-on-bad-exit for one-task servers) while the orchestrator decides
        main=r.kind == "inference" and ctx.serving_is_main, fail_fast=r.kind != "inference" and multi, health=health,
        instances=instances, reads_model=True, orchestrated=r.kind == "rl",
        task=ctx.task(
            Supervisor(name, gpus=shell.gpu_slice(slot.gpus[0], shape.gpus, not multi), ready=ready,
                       ready_completion=completion, fail_on=tuple(inf.fail_on),
                       **restart_of(inf), worker_tasks=shape.span if multi else None),
            prelude=[*shell.declare(*names), *prelude], env=env,
            command=(*ctx.py, *(flags.SERVE if multi else flags.ENTRY), *args),
        ),
    ))
