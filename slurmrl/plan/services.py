"""Head-node services: vllm-router in front of the servers (vLLM's or SGLang's); the Mooncake store is the
vLLM engine's (``slurmrl.plan.engines.vllm.mooncake``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slurmrl import ports
from slurmrl.contract.argv import AuthGate
from slurmrl.errors import UserError
from slurmrl.plan import router_rules, shell
from slurmrl.plan.context import Context
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.placement import server_names
from slurmrl.plan.rules import changed
from slurmrl.plan.spec import Spec, Supervisor, restart_of

SERVICE_CPUS = {"router": 2, "mooncake-master": 1, "mooncake-client": 1}
ROUTER_HEALTH_INTERVAL_S = 5

# an engine's own rules of the router's settings: (its [inference], the policy of each pool)
EngineCheck = Callable[[router_rules.Routed, dict[str, str]], None]


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


def router(ctx: Context, enabled: bool, pd_pools: Sequence[str] = (), kv_connector: str | None = None,
           check: EngineCheck | None = None) -> None:
    """vllm-router (``enabled``: see router_enabled) in front of the servers, with its pools. The engine
    whose servers it fronts gives, in mode ``pd``, the prelude lines that fill its ``pools`` array from
    the ``prefill`` and ``decode`` URL arrays, and its ``--kv-connector`` value; ``check``: its own rules
    of the router's settings, after the router's (``router_rules.check``)."""
    inf = routed(ctx)
    if not enabled:
        for name in type(inf.router).model_fields:  # no silent knobs: the router's settings need a router
            if name != "enabled" and changed(inf.router, name):
                why = "router.enabled is false" if inf.router.enabled is False else "there is one server"
                raise UserError(f"inference.router.{name}", f"no router runs ({why}); set inference.router.enabled "
                                "= true to run one, or remove it")
        return
    router_rules.check(inf)
    if check is not None:
        check(inf, router_rules.policies(inf))
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
            *pd_pools,
        ]
        args += ["--vllm-pd-disaggregation", "--prefill-policy", policy["prefill"],
                 "--decode-policy", policy["decode"], *router_rules.option_args(inf), Sh(sh="${pools[@]}")]
        if publishing:
            prelude += _event_sources("--pd-kv-events", "prefill")
            args.append(Sh(sh="${events[@]}"))
        if kv_connector:  # how the P/D servers move KV (vLLM's name it)
            args += ["--kv-connector", kv_connector]
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
                       ready_completion=ctx.r.model.served_model_name, **restart_of(inf.router)),
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
