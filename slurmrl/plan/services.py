"""Head-node services: vllm-router in front of the servers, the Mooncake store."""

from __future__ import annotations

from slurmrl.plan import shell
from slurmrl.plan.model import Health, Instance, Sh
from slurmrl.plan.servers import server_names

SERVICE_CPUS = {"router": 2, "mooncake-master": 1, "mooncake-client": 1}
ROUTER_HEALTH_INTERVAL_S = 5
KV_CONNECTOR_FLAG = {"NixlConnector": "nixl"}  # vllm-router knows nixl, mooncake, moriio


def router_enabled(b) -> bool:
    inf = b.r.inference
    if inf.router.enabled is not None:
        return inf.router.enabled
    servers = sum(len(b.comp(n)["instances"]) for n in server_names(b))
    return servers > 1 or inf.mode == "pd"


def router(b) -> None:
    inf = b.r.inference
    if not router_enabled(b):
        return
    head = b.groups[b.comp(server_names(b)[0])["group"]]
    b.reserve(head, 0, SERVICE_CPUS["router"], "the router")
    port = shell.var("router")
    args = [
        "--host", "0.0.0.0", "--port", port,
        "--prometheus-host", "0.0.0.0", "--prometheus-port", shell.var("router_metrics"),
        "--health-check-interval-secs", str(ROUTER_HEALTH_INTERVAL_S), "--health-failure-threshold", "1",
        "--worker-startup-timeout-secs", str(inf.startup_timeout),
    ]
    if inf.mode == "pd":
        prelude = [
            *shell.declare("host", "url", arrays=("prefill", "decode", "pools")),
            shell.HOST_LINE,
            "pools=()",
            'read -ra prefill <<<"${URLS_PREFILL}"',
            'read -ra decode <<<"${URLS_DECODE}"',
            'for url in "${prefill[@]}"; do pools+=(--prefill "${url}"); done',
            'for url in "${decode[@]}"; do pools+=(--decode "${url}"); done',
        ]
        args += ["--vllm-pd-disaggregation", "--prefill-policy", inf.router.policy,
                 "--decode-policy", inf.router.policy, Sh(sh="${pools[@]}")]
        if inf.kv_connector in KV_CONNECTOR_FLAG:
            args += ["--kv-connector", KV_CONNECTOR_FLAG[inf.kv_connector]]
    else:
        prelude = [*shell.declare("host", arrays=("workers",)), shell.HOST_LINE, 'read -ra workers <<<"${URLS_INFERENCE}"']
        args += ["--policy", inf.router.policy, "--worker-urls", Sh(sh="${workers[@]}")]
    args += list(inf.router.extra_args)
    b.add(
        name="router", role="router", group=head.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=SERVICE_CPUS["router"], gpus_per_node=0, stage=3,
        health=Health(kind="http", ports=("router",), first_node_only=True, timeout=300, urls_var="URLS_ROUTER"),
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={"http": "router", "metrics": "router_metrics"}),),
        task=b.task(
            "router", prelude=prelude,
            supervisor=b.supervise("router", ready=shell.url("http", port)),
            command=(*shell.tool(b.py, "vllm-router"), *args),
        ),
    )


def mooncake(b) -> None:
    off = b.r.inference.kv_offload
    if off.kind != "mooncake":
        return
    slot = b.slots["inference"]
    g = b.groups[slot.group]
    b.reserve(g, 0, SERVICE_CPUS["mooncake-master"], "the Mooncake master")
    rpc, meta, admin = shell.var("mooncake_rpc"), shell.var("mooncake_metadata"), shell.var("mooncake_admin")
    b.add(
        name="mooncake-master", role="mooncake", group=g.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=1, gpus_per_node=0, stage=0,
        health=Health(kind="tcp", ports=("mooncake_rpc",), first_node_only=True, timeout=120),
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={
            "rpc": "mooncake_rpc", "metadata": "mooncake_metadata", "admin": "mooncake_admin"}),),
        task=b.task(
            "mooncake-master", prelude=[*shell.declare("host"), shell.HOST_LINE],
            supervisor=b.supervise("mooncake-master", ready=shell.url("tcp", rpc)),
            command=(
                *shell.tool(b.py, "mooncake_master"), Sh(sh=f"-rpc_port={rpc.sh}"),
                "-enable_http_metadata_server=true", Sh(sh=f"-http_metadata_server_port={meta.sh}"),
                Sh(sh=f"-metrics_port={admin.sh}"),
            ),
        ),
    )
    for node in range(slot.nodes):
        b.reserve(g, node, SERVICE_CPUS["mooncake-client"], "the Mooncake client")
    client, h = shell.var("mooncake_client"), shell.head(g.index).sh
    command = [
        *shell.tool(b.py, "mooncake_client"),
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
    b.add(
        name="mooncake-client", role="mooncake", group=g.index, first_node=0, nodes=slot.nodes, tasks_per_node=1,
        cpus_per_task=1, gpus_per_node=0, stage=1,
        health=Health(kind="tcp", ports=("mooncake_client",), timeout=120),
        instances=tuple(
            Instance(rank=n, node=n, local=0, gpus=(), ports={"client": "mooncake_client"}) for n in range(slot.nodes)
        ),
        task=b.task(
            "mooncake-client", prelude=[*shell.declare("host"), shell.HOST_LINE], env=env,
            supervisor=b.supervise("mooncake-client", ready=shell.url("tcp", client), cuda_runtime=True),
            command=tuple(command),
        ),
    )
