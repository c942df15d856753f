"""vLLM server components: how many servers per node, their GPUs, ports and command line."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl import ports
from slurmrl.plan import shell, vllm
from slurmrl.plan.model import Health, Instance, Sh
from slurmrl.plan.placement import Slot


def server_shape(b, slot: Slot, tp: int, dp: int, where: str) -> tuple[int, int]:
    """(servers per node, GPUs per server) for this slot, or a UserError naming the field."""
    inf, n = b.r.inference, len(slot.gpus)
    if inf.mode == "wide_ep":
        if n % tp:
            raise UserError("inference.tp", f"tp={tp} does not divide the {n} inference GPUs per node")
        total = n // tp * slot.nodes
        if inf.dp not in (1, total):
            raise UserError(
                "inference.dp",
                f"wide-EP over {slot.nodes} nodes x {n} GPUs with tp={tp} has {total} data-parallel ranks, "
                f"not {inf.dp}; set dp = {total} or leave it out",
            )
        return 1, n
    sg = tp * dp
    if sg > n:
        raise UserError(
            f"{where}.tp",
            f"one server needs tp x dp = {sg} GPUs but has {n} per node; multi-node servers need mode 'wide_ep'",
        )
    if n % sg:
        raise UserError(f"{where}.tp", f"tp x dp = {sg} does not divide the {n} inference GPUs per node")
    if n // sg > ports.MAX_LOCAL:
        raise UserError(f"{where}.tp", f"{n // sg} servers per node; at most {ports.MAX_LOCAL} are supported")
    return n // sg, sg


def vllm_env(b, role_env: dict) -> list:
    r, inf = b.r, b.r.inference
    env: list = sorted({**inf.env, **role_env}.items())
    admin = inf.admin_endpoints if inf.admin_endpoints is not None else r.kind == "rl"
    if admin:
        env.append(("VLLM_SERVER_DEV_MODE", "1"))  # pause / reload_weights / resume endpoints
    if inf.max_lora_rank:
        env.append(("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"))
    return env


def servers(b, name: str, slot: Slot, tp: int, dp: int, extra: list[str], role_env: dict, pd_role: str | None):
    r, inf = b.r, b.r.inference
    where = f"inference.{pd_role}" if pd_role else "inference"
    per_node, sg = server_shape(b, slot, tp, dp, where)
    if r.placement.share_gpus and inf.gpu_memory_utilization is None:
        inf = inf.model_copy(update={"gpu_memory_utilization": 0.45})
        b.warnings.append("inference.gpu_memory_utilization set to 0.45: the trainer shares the GPU")
    prelude = [shell.HOST_LINE, f"port={shell.per_task('server')}"]
    names = ["host", "port"]
    args = vllm.common_args(r.model, inf, tp)
    env = vllm_env(b, role_env)
    ready = shell.url("http", vllm.PORT)
    if inf.mode == "wide_ep":
        dp_local = len(slot.gpus) // tp
        p, a = vllm.wide_ep(dp_local * slot.nodes, dp_local, slot.group, inf.expert_parallel is not False)
        prelude += p + [f'ready={ready.sh}', "((SLURM_NODEID == 0)) || ready=started  # headless: serves no API"]
        names += ["ready", "rank_args"]
        args += a
        ready = Sh(sh="${ready}")
    else:
        p, a = vllm.local_dp(dp)
        prelude += p
        names += ["dp_rpc"] if p else []
        args += a
        if inf.expert_parallel:
            args.append("--enable-expert-parallel")
    if pd_role:
        p, a, e = vllm.pd(inf.kv_connector, pd_role, slot.gpus[0], sg, b.slots["prefill"].group)
        prelude += p
        names += [line.split("=")[0] for line in p]
        args += a
        env += e
    a, e = vllm.offload(inf, per_node, slot.group)
    args += a + list(inf.extra_args) + list(extra)
    env += e
    instances = []
    for node in range(slot.nodes):
        for local in range(per_node):
            gpus = slot.gpus[local * sg:(local + 1) * sg]
            iports = {"http": f"server_{local}"}
            if inf.mode == "wide_ep":
                iports["dp_rpc"] = "dp_rpc"
            elif dp > 1:
                iports["dp_rpc"] = f"dprpc_{local}"
            if pd_role:
                iports["kv"] = f"kv_{local}" if inf.kv_connector == "P2pNcclConnector" else f"nixl_{gpus[0]}"
            instances.append(Instance(rank=len(instances), node=node, local=local, gpus=gpus, ports=iports))
    health = Health(
        kind="http",
        ports=tuple(f"server_{i}" for i in range(per_node)),
        first_node_only=inf.mode == "wide_ep",
        timeout=inf.startup_timeout,
        urls_var=f"URLS_{name.upper()}",
    )
    b.add(
        name=name, role="inference", group=slot.group, slot=slot, first_node=slot.first_node, nodes=slot.nodes,
        tasks_per_node=per_node, gpus_per_node=len(slot.gpus), stage=2, main=r.kind == "inference",
        fail_fast=r.kind != "inference", health=health, instances=tuple(instances),
        task=b.task(
            name, prelude=[*shell.declare(*names), *prelude], env=env,
            supervisor=b.supervise(name, gpus=shell.gpu_slice(slot.gpus[0], sg, inf.mode != "wide_ep"), ready=ready),
            command=(*b.py, *vllm.ENTRY, *args),
        ),
    )


def inference(b) -> None:
    inf = b.r.inference
    if inf.mode == "pd":
        for role in ("prefill", "decode"):
            spec = getattr(inf, role)
            servers(b, role, b.slots[role], spec.tp, 1, spec.extra_args, spec.env, role)
    else:
        servers(b, "inference", b.slots["inference"], inf.tp, inf.dp, [], {}, None)


def server_names(b) -> tuple[str, ...]:
    return ("prefill", "decode") if b.r.inference.mode == "pd" else ("inference",)
