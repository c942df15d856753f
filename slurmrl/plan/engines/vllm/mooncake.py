"""The Mooncake store (``inference.kv_offload.kind = "mooncake"``): its master on the first inference
node, a client on every inference node (one component per het group), in front of the vLLM servers."""

from __future__ import annotations

from slurmrl.plan import shell
from slurmrl.plan.context import Context
from slurmrl.plan.engines.vllm.section import section
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.placement import server_names
from slurmrl.plan.services import SERVICE_CPUS
from slurmrl.plan.spec import Spec, Supervisor


def store(ctx: Context) -> None:
    off = section(ctx).kv_offload
    if off.kind != "mooncake":
        return
    groups: dict[int, int] = {}  # het group -> inference nodes in it: a client on each
    for n in server_names(ctx.r):
        slot = ctx.slots[n]
        groups[slot.group] = max(groups.get(slot.group, 0), slot.first_node + slot.nodes)
    g = ctx.groups[next(iter(groups))]
    ctx.reserve(g, 0, SERVICE_CPUS["mooncake-master"], "the Mooncake master")
    rpc, meta, admin = shell.var("mooncake_rpc"), shell.var("mooncake_metadata"), shell.var("mooncake_admin")
    ctx.add(Spec(
        name="mooncake-master", role="mooncake", group=g.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=1, gpus_per_node=0, stage=0,
        health=Health(kind="tcp", ports=("mooncake_rpc",), first_node_only=True, timeout=120),
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={
            "rpc": "mooncake_rpc", "metadata": "mooncake_metadata", "admin": "mooncake_admin"}),),
        task=ctx.task(
            Supervisor("mooncake-master", ready=shell.url("tcp", rpc)),
            prelude=[*shell.declare("host"), shell.HOST_LINE],
            command=(
                *shell.tool(ctx.py, "mooncake_master"), Sh(sh=f"-rpc_port={rpc.sh}"),
                "-enable_http_metadata_server=true", Sh(sh=f"-http_metadata_server_port={meta.sh}"),
                Sh(sh=f"-metrics_port={admin.sh}"),
            ),
        ),
    ))
    client, h = shell.var("mooncake_client"), shell.head(g.index).sh
    command: list[Arg] = [
        *shell.tool(ctx.py, "mooncake_client"),
        Sh(sh=f"--master_server_address={h}:{rpc.sh}"),
        Sh(sh=f"--metadata_server=http://{h}:{meta.sh}/metadata"),
        f"--global_segment_size={off.cpu_gb:g} GB",
        f"--protocol={off.mooncake_protocol}",
        Sh(sh="--local_hostname=${host}"),
        Sh(sh=f"--port={client.sh}"),
    ]
    env = []
    if off.mooncake_device:
        command.append(f"--device_names={off.mooncake_device}")
    if off.disk_path:
        command.append("--enable_offload=true")
        env.append(("MOONCAKE_OFFLOAD_STORAGE_ROOT_DIR", off.disk_path))
    for gi, nodes in groups.items():  # one client component per het group (a step spans one group)
        cg = ctx.groups[gi]
        name = "mooncake-client" if len(groups) == 1 else f"mooncake-client-{cg.name}"
        for node in range(nodes):
            ctx.reserve(cg, node, SERVICE_CPUS["mooncake-client"], "the Mooncake client")
        ctx.add(Spec(
            name=name, role="mooncake", group=gi, first_node=0, nodes=nodes, tasks_per_node=1,
            cpus_per_task=1, gpus_per_node=0, stage=1,
            health=Health(kind="tcp", ports=("mooncake_client",), timeout=120),
            instances=tuple(
                Instance(rank=n, node=n, local=0, gpus=(), ports={"client": "mooncake_client"}) for n in range(nodes)
            ),
            task=ctx.task(
                Supervisor(name, ready=shell.url("tcp", client), cuda_runtime=True),
                prelude=[*shell.declare("host"), shell.HOST_LINE], env=env,
                command=tuple(command),
            ),
        ))
