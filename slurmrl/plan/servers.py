"""vLLM server components: how many servers per node, their GPUs, ports and command line."""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl.errors import UserError
from slurmrl import ports
from slurmrl.plan import placement, shell, vllm
from slurmrl.plan.model import Health, Instance, Sh
from slurmrl.plan.placement import Slot


@dataclass(frozen=True)
class Shape:
    """How one inference component's GPUs form workers (vLLM deployments)."""

    per_node: int  # tasks per node: workers per node, or 1 when a worker spans nodes
    gpus: int  # GPUs per task
    span: int  # nodes per worker
    dp: int  # data-parallel ranks per worker
    dp_local: int  # data-parallel ranks per task


def server_shape(b, slot: Slot, tp: int, dp: int, where: str, span: int | None = None) -> Shape:
    """Workers of tp x dp GPUs on this slot, or a UserError naming the field."""
    inf, n = b.r.inference, len(slot.gpus)
    if inf.mode == "wide_ep" and dp == 1:
        if n % tp:
            raise UserError("inference.tp", f"tp={tp} does not divide the {n} inference GPUs per node")
        dp = n // tp * slot.nodes  # one deployment over every node
    if span is None:
        span, _ = placement.worker_span(where, tp, dp, n, None)
    if span > 1:
        if n % tp or tp * dp != n * span:
            raise UserError(f"{where}.tp", f"tp={tp} does not divide the {n} inference GPUs per node")
        if slot.nodes % span:
            raise UserError(
                "inference.nodes" if where == "inference" else f"{where}.nodes",
                f"{slot.nodes} nodes do not hold whole workers of {span} nodes (tp x dp = {tp * dp} GPUs); "
                f"use a multiple of {span}",
            )
        return Shape(per_node=1, gpus=n, span=span, dp=dp, dp_local=n // tp)
    sg = tp * dp
    if n % sg:
        raise UserError(f"{where}.tp", f"tp x dp = {sg} does not divide the {n} inference GPUs per node")
    if n // sg > ports.MAX_LOCAL:
        raise UserError(f"{where}.tp", f"{n // sg} servers per node; at most {ports.MAX_LOCAL} are supported")
    return Shape(per_node=n // sg, gpus=sg, span=1, dp=dp, dp_local=dp)


def vllm_env(b, role_env: dict) -> list:
    r, inf = b.r, b.r.inference
    env: list = sorted({**inf.env, **role_env}.items())
    admin = inf.admin_endpoints if inf.admin_endpoints is not None else r.kind == "rl"
    if admin:
        env.append(("VLLM_SERVER_DEV_MODE", "1"))  # pause / reload_weights / resume endpoints
    if inf.max_lora_rank:
        env.append(("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"))
    return env


def servers(b, name: str, slot: Slot, tp: int, dp: int, extra: list[str], role_env: dict, pd_role: str | None,
            expert_parallel: bool, span: int | None = None, first_index: int = 0, neighbours: int = 0):
    """One inference component: its workers' vLLM command line, once, with per-task values in the
    prelude. ``first_index``: the first per-node port index it may use, ``neighbours``: servers of
    other components on the same nodes (P/D sharing nodes)."""
    r, inf = b.r, b.r.inference
    where = f"inference.{pd_role}" if pd_role else "inference"
    shape = server_shape(b, slot, tp, dp, where, span)
    if r.placement.share_gpus and inf.gpu_memory_utilization is None:
        inf = inf.model_copy(update={"gpu_memory_utilization": 0.45})
        b.warnings.append("inference.gpu_memory_utilization set to 0.45: the trainer shares the GPU")
    hybrid = r.placement.colocate == "hybrid"
    if hybrid:  # sleep mode's allocator (cumem) is CUDA's: the CPU build refuses it
        b.warnings.append("placement.colocate = \"hybrid\" starts vLLM with --enable-sleep-mode, which needs CUDA "
                          "GPUs on the node (vLLM's CPU build and CPU-only partitions refuse it)")
    multi = shape.span > 1
    prelude = [shell.HOST_LINE, f"port={shell.per_task('server', first_index)}"]
    names = ["host", "port"]
    args = vllm.common_args(r.model, inf, tp)
    if hybrid:  # the orchestrator puts it to sleep while the trainer steps (slurmrl.runtime.orchestrator.hybrid)
        args.append("--enable-sleep-mode")
    env = vllm_env(b, role_env)
    ready = shell.url("http", vllm.PORT)
    if multi:
        p, a = vllm.multi_node(shape.dp, shape.dp_local, shape.span, slot.group, slot.first_node, first_index)
        prelude += p + [f'ready={ready.sh}', "((rank == 0)) || ready=started  # headless: serves no API"]
        names += ["nodes", "leader", "rank", "ready", "rank_args"]
        args += a
        ready = Sh(sh="${ready}")
    else:
        p, a = vllm.local_dp(shape.dp, first_index)
        prelude += p
        names += ["dp_rpc"] if p else []
        args += a
    if expert_parallel:
        args.append("--enable-expert-parallel")
    transfer = None
    if pd_role:
        p, transfer, e = vllm.pd(inf, pd_role, slot.gpus[0], shape.gpus, first_index, multi)
        prelude += p
        names += [line.split("=")[0] for line in p]
        env += e
    args += vllm.kv_events(inf, name)  # vllm-router's kv_aware policy reads them
    a, e = vllm.offload(inf, shape.per_node + neighbours, b.slots[server_names(b)[0]].group, transfer)
    args += a + list(inf.extra_args) + list(extra)
    env += e
    instances = []
    for node in range(slot.nodes):
        lead = node % shape.span == 0
        for local in range(shape.per_node):
            gpus = slot.gpus[local * shape.gpus:(local + 1) * shape.gpus]
            index = first_index + local
            iports = {"http": f"server_{index}"} if lead else {}
            if lead and shape.dp > 1:
                iports["dp_rpc"] = f"dprpc_{index}"
            if pd_role == "prefill" and inf.kv_connector == "MooncakeConnector" and lead:
                iports["kv"] = f"kv_{index}"  # the Mooncake bootstrap port
            elif pd_role and inf.kv_connector == "NixlConnector":  # NIXL: one side-channel port per engine (data-parallel rank) of the task
                iports.update({f"kv{k or ''}": f"nixl_{gpus[0] + k}" for k in range(shape.dp_local)})
            instances.append(Instance(rank=len(instances), node=node, local=local, gpus=gpus, ports=iports))
    health = Health(
        kind="http",
        ports=tuple(f"server_{first_index + i}" for i in range(shape.per_node)),
        first_node_only=inf.mode == "wide_ep" and shape.span == slot.nodes,
        nodes_per_server=shape.span,
        timeout=inf.startup_timeout,
        urls_var=f"URLS_{name.upper()}",
    )
    b.add(
        name=name, role="inference", group=slot.group, slot=slot, first_node=slot.first_node, nodes=slot.nodes,
        tasks_per_node=shape.per_node, gpus_per_node=len(slot.gpus), stage=2, main=r.kind == "inference",
        fail_fast=r.kind != "inference", health=health, instances=tuple(instances),
        task=b.task(
            name, prelude=[*shell.declare(*names), *prelude], env=env,
            supervisor=b.supervise(
                name, gpus=shell.gpu_slice(slot.gpus[0], shape.gpus, not multi), ready=ready),
            command=(*b.py, *(vllm.SERVE if multi else vllm.ENTRY), *args),
        ),
    )


def inference(b) -> None:
    inf = b.r.inference
    if inf.mode == "pd":
        specs = {role: getattr(inf, role) for role in ("prefill", "decode")}
        per_node = {role: server_shape(b, b.slots[role], s.tp, s.dp, f"inference.{role}", s.nodes_per_worker).per_node
                    for role, s in specs.items()}
        first = 0
        for role, spec in specs.items():
            others = sum(per_node.values()) - per_node[role] if inf.share_nodes else 0
            servers(b, role, b.slots[role], spec.tp, spec.dp, spec.extra_args, spec.env, role, spec.expert_parallel,
                    span=spec.nodes_per_worker, first_index=first, neighbours=others)
            if inf.share_nodes:
                first += per_node[role]
    else:
        ep = inf.expert_parallel if inf.expert_parallel is not None else inf.mode == "wide_ep"
        servers(b, "inference", b.slots["inference"], inf.tp, inf.dp, [], {}, None, ep)


def server_names(b) -> tuple[str, ...]:
    return ("prefill", "decode") if b.r.inference.mode == "pd" else ("inference",)
