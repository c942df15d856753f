"""Head-node services: vllm-router in front of the servers (vLLM's or SGLang's), the Mooncake store."""

from __future__ import annotations

from slurmrl import ports
from slurmrl.contract.argv import AuthGate
from slurmrl.errors import UserError
from slurmrl.plan import router_rules, shell
from slurmrl.plan.context import Context
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.placement import server_names
from slurmrl.plan.rules import changed
from slurmrl.plan.spec import Spec, Supervisor

SERVICE_CPUS = {"router": 2, "mooncake-master": 1, "mooncake-client": 1}
ROUTER_HEALTH_INTERVAL_S = 5
KV_CONNECTOR_FLAG = {"NixlConnector": "nixl", "MooncakeConnector": "mooncake"}  # vllm-router: nixl, mooncake, moriio


# The router's worker count, from the arrays its task function reads the servers' URLs into.
ROUTER_WORKERS = {
    "pd": Sh(sh="$((${#prefill[@]} + ${#decode[@]}))"),
    "other": Sh(sh="${#workers[@]}"),
}


def router_program(ctx: Context) -> tuple[str, ...]:
    """``vllm-router``; in P/D mode with the job's secret, our module that runs it with the secret as
    the key it sends to the servers (it does not forward the client's Authorization there)."""
    inf = routed(ctx)
    if inf.mode == "pd" and inf.auth == "job_secret":
        return (*ctx.py, "-m", "slurmrl.runtime.gates.router_key")
    return shell.tool(ctx.py, "vllm-router")


def routed(ctx: Context) -> router_rules.Routed:
    """[inference] of a recipe whose servers vllm-router may front."""
    inf = ctx.inference
    assert isinstance(inf, router_rules.Routed), "vllm-router fronts vLLM's and SGLang's servers only"
    return inf


def router_enabled(inf: router_rules.Routed, servers: int) -> bool:
    """vllm-router runs when asked, or in front of more than one server task (``servers``), or for P/D."""
    if inf.router.enabled is not None:
        return inf.router.enabled
    return servers > 1 or inf.mode == "pd"


def router(ctx: Context, enabled: bool) -> None:
    """vllm-router (``enabled``: see router_enabled) in front of the servers, with its pools."""
    inf = routed(ctx)
    if not enabled:
        for name in type(inf.router).model_fields:  # no silent knobs: the router's settings need a router
            if name != "enabled" and changed(inf.router, name):
                why = "router.enabled is false" if inf.router.enabled is False else "there is one server"
                raise UserError(f"inference.router.{name}", f"no router runs ({why}); set inference.router.enabled "
                                "= true to run one, or remove it")
        return
    router_rules.check(inf)
    publishing = [n for n in server_names(ctx.r) if router_rules.reads_events(inf, n)]
    head = ctx.groups[ctx.spec(server_names(ctx.r)[0]).group]
    ctx.reserve(head, 0, SERVICE_CPUS["router"], "the router")
    port = shell.var("router")
    gate = inf.auth == "job_secret"  # vllm-router checks no credential on its management routes
    args = [
        "--host", "127.0.0.1" if gate else "0.0.0.0", "--port", shell.var("router_upstream") if gate else port,
        "--prometheus-host", "0.0.0.0", "--prometheus-port", shell.var("router_metrics"),
        "--health-check-interval-secs", str(ROUTER_HEALTH_INTERVAL_S), "--health-failure-threshold", "1",
        "--worker-startup-timeout-secs", str(inf.startup_timeout),
    ]
    policy = router_rules.policies(inf)
    events = ("events",) if publishing else ()  # the array of --kv-event-source / --pd-kv-events words
    loop = ("url", "addr") if publishing else ()  # its loop's variables
    if inf.mode == "pd":
        prelude = [
            *shell.declare("host", "url", *loop[1:], arrays=("prefill", "decode", "pools", *events)),
            shell.HOST_LINE,
            "pools=()",
            'read -ra prefill <<<"${URLS_PREFILL}"',
            'read -ra decode <<<"${URLS_DECODE}"',
            'for url in "${prefill[@]}"; do pools+=(--prefill "${url}"); done'
            if ctx.vllm.kv_connector != "MooncakeConnector" else
            # each prefill server's Mooncake bootstrap port: its HTTP port + the distance between the two blocks
            'for url in "${prefill[@]}"; do pools+=(--prefill "${url}" "$((${url##*:} + PORT_KV_0 - PORT_SERVER_0))"); done',
            'for url in "${decode[@]}"; do pools+=(--decode "${url}"); done',
        ]
        args += ["--vllm-pd-disaggregation", "--prefill-policy", policy["prefill"],
                 "--decode-policy", policy["decode"], *router_rules.option_args(inf), Sh(sh="${pools[@]}")]
        if publishing:
            prelude += _event_sources("--pd-kv-events", "prefill")
            args.append(Sh(sh="${events[@]}"))
        if ctx.vllm.kv_connector in KV_CONNECTOR_FLAG:  # P/D: vLLM's servers only
            args += ["--kv-connector", KV_CONNECTOR_FLAG[ctx.vllm.kv_connector]]
    else:
        prelude = [*shell.declare("host", *loop, arrays=("workers", *events)),
                   shell.HOST_LINE, 'read -ra workers <<<"${URLS_INFERENCE}"']
        args += ["--policy", policy["inference"], *router_rules.option_args(inf)]
        if publishing:
            prelude += _event_sources("--kv-event-source", "workers")
            model = inf.router.kv_event_model or ctx.r.model.served_model_name  # the router requires one
            args += [Sh(sh="${events[@]}"), "--kv-event-model", model]
        args += ["--worker-urls", Sh(sh="${workers[@]}")]
    args += list(inf.router.extra_args)
    ctx.add(Spec(
        name="router", role="router", group=head.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=SERVICE_CPUS["router"], gpus_per_node=0, stage=3,
        health=Health(kind="http", ports=("router",), first_node_only=True, timeout=300, urls_var="URLS_ROUTER"),
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={
            "http": "router", "metrics": "router_metrics",
            **({"upstream": "router_upstream"} if gate else {})}),),
        task=ctx.task(
            # ready means serving: every server registered, and one completion through the router
            Supervisor("router", ready=shell.url("http", port),
                       ready_workers=ROUTER_WORKERS["pd" if inf.mode == "pd" else "other"],
                       ready_completion=ctx.r.model.served_model_name),
            prelude=prelude,
            command=(*(gate_program(ctx, port) if gate else ()), *router_program(ctx), *args),
        ),
    ))


def gate_program(ctx: Context, port: Sh) -> tuple[Arg, ...]:
    """``python -m slurmrl.runtime.gates.auth_gate --listen 0.0.0.0:PORT --upstream PORT --``: the job's
    port, where every request but /health and /metrics needs the secret, in front of the router."""
    gate = AuthGate[Arg](Sh(sh=f"0.0.0.0:{port.sh}"), shell.var("router_upstream"))
    return (*ctx.py, "-m", AuthGate.MODULE, *gate.to_argv())


def _event_sources(flag: str, workers: str) -> list[str]:
    """Prelude lines: ``flag URL=tcp://HOST:PORT`` for each server URL in the array ``workers``;
    a server publishes its KV events on its HTTP port plus the distance between the port blocks."""
    distance = f"{ports.shell_var('kv_events_0')} - {ports.shell_var('server_0')}"
    return [
        f"events=()  # each server's KV events: tcp://its host:its port + ({distance})",
        f'for url in "${{{workers}[@]}}"; do addr=${{url#*://}}; '
        f'events+=({flag} "${{url}}=tcp://${{addr%:*}}:$((${{url##*:}} + {distance}))"); done',
    ]


def mooncake(ctx: Context) -> None:
    off = ctx.vllm.kv_offload
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
