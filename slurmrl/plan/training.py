"""The trainer (torchrun over the trainer nodes) and the RL orchestrator."""

from __future__ import annotations

from slurmrl.contract.programs import OrchestratorArgs, TrainerArgs, WeightServers
from slurmrl.errors import UserError
from slurmrl.plan import mesh, shell
from slurmrl.plan.collector import metrics_env
from slurmrl.plan.context import Context
from slurmrl.plan.engines import judge
from slurmrl.plan.model import Arg, Instance, Sh
from slurmrl.plan.placement import server_names
from slurmrl.plan.spec import Spec, Supervisor
from slurmrl.recipe.recipe import global_batch
from slurmrl.recipe.roles import orchestrator_settings, trainer_settings


def config(name: str) -> Sh:
    return Sh(sh=f"${{RUN_DIR}}/components/{name}.toml")


def trainer(ctx: Context) -> None:
    r, t = ctx.r, ctx.trainer
    slot = ctx.slots["trainer"]
    world = slot.nodes * len(slot.gpus)
    batch = global_batch(r)
    parallel = mesh.resolve(t.parallel, world, t.seq_len, r.model.path, t.lora is not None)
    unknown = mesh.unknown_experts(parallel, r.model.path)
    if unknown:
        ctx.warnings.append(unknown)
    dp = world // parallel.cp  # the cp ranks of a row share it: data parallel over the rest
    where = "orchestrator.prompts_per_step" if r.kind == "rl" else "trainer.batch_size"
    if batch % (t.micro_batch_size * dp):
        raise UserError(
            where,
            f"a batch of {batch} sequences does not split into micro_batch_size {t.micro_batch_size} "
            f"x {dp} data-parallel trainer GPUs" + (f" ({world} / cp {parallel.cp})" if parallel.cp > 1 else ""),
        )
    head = shell.head(slot.group).sh
    prelude, program = trainer_program(ctx)
    command: tuple[Arg, ...] = (
        *shell.tool(ctx.py, "torchrun"),
        f"--nnodes={slot.nodes}", f"--nproc-per-node={len(slot.gpus)}", "--rdzv-backend=c10d",
        Sh(sh=f"--rdzv-endpoint={head}:{shell.var('torch_rdzv').sh}"), Sh(sh="--rdzv-id=${SLURM_JOB_ID}"),
        f"--shutdown-timeout={r.slurm.grace_seconds}",  # time workers get after TERM to checkpoint
        "-m", TrainerArgs.MODULE, *program.to_argv(),
    )
    settings = trainer_settings(r, ctx.run_dir, world, batch).model_copy(update={"parallel": parallel})
    ctx.add(Spec(
        name="trainer", role="trainer", group=slot.group, slot=slot, first_node=slot.first_node, nodes=slot.nodes,
        tasks_per_node=1, gpus_per_node=len(slot.gpus), stage=4, main=True, health=None,
        instances=tuple(
            Instance(rank=n, node=n, local=0, gpus=slot.gpus,  # torchrun's rank 0 (the group's host) on any node
                     ports={**({"rdzv": "torch_rdzv"} if n == 0 else {}),
                            **({"weights": "weight_broadcast"} if program.weight_servers else {})})
            for n in range(slot.nodes)
        ),
        task=ctx.task(
            Supervisor("trainer", gpus=shell.gpu_slice(slot.gpus[0], len(slot.gpus), False),
                       heartbeat=r.slurm.heartbeat_timeout, fail_on=tuple(t.fail_on)),
            prelude=prelude, env=[*sorted(t.env.items()), *metrics_env(ctx, "trainer_metrics")], command=command,
        ),
        settings=settings,
    ))


def trainer_program(ctx: Context) -> tuple[list[str], TrainerArgs[Arg]]:
    """The trainer's command line (after ``-m``) and the prelude lines its words need. With
    ``trainer.weight_sync`` by broadcast: the trainer's task reads each server component's URLs
    and gets, per component, how many worker processes each of its servers has (``--weight-servers
    RANKS URL...``; every TP/DP rank joins the transfer group: both roles in P/D), where it hosts the
    group (its own node: torchrun's rank 0 uses the value of the task it runs in; the port table's
    ``weight_broadcast``) and the group's size."""
    r = ctx.r
    if r.kind != "rl" or not ctx.trainer.sync.by_broadcast:
        return [], TrainerArgs[Arg](config("trainer"))
    prelude: list[str] = []
    groups: list[WeightServers[Arg]] = []
    workers = 0
    names = server_names(r)
    for name in names:
        leads = sum(1 for i in ctx.spec(name).instances if "http" in i.ports)
        ranks = ctx.weight_ranks[name]  # broadcast drives vLLM's weight-transfer routes: its engine counts them
        prelude.append(f'read -ra servers_{name} <<<"${{URLS_{name.upper()}}}"')
        groups.append(WeightServers(ranks, (Sh(sh=f"${{servers_{name}[@]}}"),)))
        workers += leads * ranks
    master = Sh(sh=f"${{host}}:{shell.var('weight_broadcast').sh}")
    arrays = tuple(f"servers_{n}" for n in names)
    return ([*shell.declare("host", arrays=arrays), shell.HOST_LINE, *prelude],
            TrainerArgs[Arg](config("trainer"), tuple(groups), master, 1 + workers))


def orchestrator(ctx: Context) -> None:
    r, o = ctx.r, ctx.orchestrator
    if o.placement == "own":
        g = ctx.group("orchestrator", 1, 0)
    elif o.placement == "trainer":
        g = ctx.groups[ctx.slots["trainer"].group]
    else:
        g = ctx.groups[ctx.spec(server_names(r)[0]).group]
    ctx.reserve(g, 0, o.cpus, "the orchestrator")
    servers = server_names(r)
    serving = sum(1 for n in servers for i in ctx.spec(n).instances if "http" in i.ports)  # the servers' URLs
    assert r.inference is not None, "kind rl has [inference] (check_sections)"
    if r.inference.min_servers > serving:
        raise UserError("inference.min_servers", f"is {r.inference.min_servers}, but the job has {serving} inference "
                        f"server{'s' if serving != 1 else ''}; set at most {serving}")
    urls = " ".join(f"${{URLS_{n.upper()}}}" for n in servers)
    judge_prelude, judge_urls = judge.orchestrator_words(ctx)
    prelude = [*shell.declare(arrays=("servers",)), f'read -ra servers <<<"{urls}"', *judge_prelude]
    requests = Sh(sh="${URLS_ROUTER}") if ctx.has("router") else Sh(sh="${servers[@]}")
    settings = orchestrator_settings(r, ctx.run_dir)
    ctx.add(Spec(
        name="orchestrator", role="orchestrator", group=g.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=o.cpus, gpus_per_node=0, stage=4, main=True, health=None,
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={}),),
        task=ctx.task(
            Supervisor("orchestrator", heartbeat=r.slurm.heartbeat_timeout, fail_on=tuple(o.fail_on)),
            prelude=prelude, env=[*sorted(o.env.items()), *metrics_env(ctx, "orchestrator_metrics")],
            command=(
                *ctx.py, "-m", OrchestratorArgs.MODULE,
                *OrchestratorArgs[Arg](config("orchestrator"), (requests,), (Sh(sh="${servers[@]}"),),
                                       judge_urls).to_argv(),
            ),
        ),
        settings=settings,
    ))
