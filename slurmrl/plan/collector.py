"""The [collector]: one CPU task on the head node (group 0, node 0) that scrapes the job's
Prometheus ``/metrics`` into RUN_DIR/metrics/scrape/ (``slurmrl.runtime.collector``). It starts with
the head-node services and finds each endpoint when it is ready: the vLLM servers' and Dynamo's
frontend's ready files, vllm-router's metrics port, and the URLs the trainer and orchestrator
register (``SLURMRL_METRICS_PORT``, ``slurmrl.plan.training``). Non-critical by default
(``collector.critical``): its exit is logged and the job goes on.
"""

from __future__ import annotations

from slurmrl.contract import job_env
from slurmrl.contract.programs import CollectorArgs
from slurmrl.plan import shell
from slurmrl.plan.context import Context
from slurmrl.plan.model import Arg, Instance, Sh
from slurmrl.plan.spec import Spec, Supervisor

CPUS = 1
STAGE = 0  # with the head-node services: it scrapes each endpoint once it is ready
SCRAPED_ROLES = ("inference", "judge", "dynamo-frontend")  # their ready URL serves /metrics too


def collector(ctx: Context) -> None:
    c = ctx.r.collector
    if c is None:
        return
    head = ctx.groups[0]
    ctx.reserve(head, 0, CPUS, "the collector")
    ready = tuple(spec.name for spec in ctx.specs if spec.role in SCRAPED_ROLES and spec.health is not None)
    targets: tuple[Arg, ...] = ()
    if ctx.has("router"):
        router = ctx.spec("router")
        targets = (Sh(sh=f"router=http://{shell.head(router.group).sh}:{shell.var('router_metrics').sh}/metrics"),)
    args = CollectorArgs[Arg](c.interval, c.max_mb, ready, targets).to_argv()
    ctx.add(Spec(
        name="collector", role="collector", group=head.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=CPUS, gpus_per_node=0, stage=STAGE, critical=c.critical, health=None,
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={}),),
        task=ctx.task(Supervisor("collector", ready="started"),
                      command=(*ctx.py, "-m", CollectorArgs.MODULE, *args)),
    ))


def metrics_env(ctx: Context, port: str) -> list[tuple[str, Arg]]:
    """The trainer's or orchestrator's ``SLURMRL_METRICS_PORT`` (port-table name ``port``) when the
    recipe has a [collector]; nothing otherwise (no /metrics is served)."""
    return [(job_env.METRICS_PORT, shell.var(port))] if ctx.r.collector is not None else []
