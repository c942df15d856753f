"""The judge: a vLLM server that scores rollouts, placed like any inference component.

``[judge]`` in a recipe: its own het group (``placement = "own"``) or GPUs of the inference nodes
after inference's and the trainer's (``"inference"``); ``tp`` GPUs per server, ``gpus_per_node / tp``
servers per node, each on a port of the server block after the inference servers of its node. Its
real vLLM command line stands in job.sbatch (``--runner pooling`` for a reward model). It starts
with the inference servers, is ready when /health answers, fails the job when it exits (unless
``critical = false``: then its exit is only logged), and the
orchestrator gets its URLs from its ready files (``--judge-urls "${judges[@]}"``).
"""

from __future__ import annotations

import random

from slurmrl import envs, ports
from slurmrl.errors import UserError
from slurmrl.plan import parallel, shell
from slurmrl.plan.context import Context
from slurmrl.plan.engines.vllm import flags as vllm
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.parallel import Parallelism, Slice
from slurmrl.plan.rules import changed
from slurmrl.plan.spec import Slot, Spec, Supervisor, restart_of
from slurmrl.recipe.judge import Judge
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.roles import judge_settings
from slurmrl.settings.judge import template_fields

name = "judge"
leftover_check = False
GENERATIVE_ONLY = ("max_tokens", "max_score")
SERVED = ("path", "served_name", "dtype", "max_model_len", "trust_remote_code")  # what the judge's vLLM reads


def check(r: Recipe) -> None:
    """The rules a [judge] (or an environment that needs one) follows; each failure names its field."""
    j, o = r.judge, r.orchestrator
    env = o.environment if o is not None else None
    if j is None:
        if env == "judge":
            raise UserError("orchestrator.environment", "'judge' scores through the job's judge; add a [judge] section "
                            "with its model (docs/rl.md)")
        return
    if r.kind != "rl":
        raise UserError("judge", f"is not used by kind {r.kind!r}; remove the [judge] section")
    if env in envs.BUILTIN and env != "judge":
        raise UserError("orchestrator.environment", f"{env!r} scores rewards itself, not through the [judge]; use "
                        "environment 'judge' or a custom one with use_judge(), or remove [judge]")
    check_fields(j)
    gpn = r.slurm.gpus_per_node
    gpus = j.gpus_per_node or j.tp
    p = parallelism(r)
    parallel.worker_span(p, gpn)  # a judge server runs on one node
    if gpus > gpn:
        raise UserError("judge.gpus_per_node", f"{gpus} is more than the {gpn} GPUs per node (slurm.gpus_per_node)")
    parallel.per_node(p, gpus, of=f"the judge's {gpus} GPUs")
    if j.placement == "inference":
        check_shared_nodes(r, j)
    check_template(r)


def check_fields(j: Judge) -> None:
    """What the judge's server reads of [judge.model], and what only a generative judge reads."""
    for name in type(j.model).model_fields:  # [judge.model] is a [model]; the rest of [model] is for the policy
        if name not in SERVED and changed(j.model, name):
            raise UserError(f"judge.model.{name}", f"applies to [model] only; the judge's server reads "
                            f"{', '.join('judge.model.' + n for n in SERVED)}")
    if j.kind == "reward_model":
        for name in GENERATIVE_ONLY:
            if changed(j, name):
                raise UserError(f"judge.{name}", "only applies to kind 'generative' (a reward model returns its score)")


def check_shared_nodes(r: Recipe, j: Judge) -> None:
    """``placement = "inference"``: the judge's servers on the policy's nodes, on GPUs of their own."""
    inf = r.inference
    assert inf is not None, "kind rl has [inference] (check_sections)"
    if inf.mode != "replicas":
        raise UserError("judge.placement", f"'inference' shares nodes with mode 'replicas' only (mode is "
                        f"{inf.mode!r}); use 'own'")
    if r.placement.share_gpus:
        raise UserError("judge.placement", "with placement.share_gpus the trainer and inference share their GPUs; "
                        "the judge needs GPUs of its own: use 'own'")
    inf_nodes = 1 if r.placement.colocate else inf.nodes
    if j.nodes > inf_nodes:
        raise UserError("judge.nodes", f"{j.nodes} judge nodes, but the judge shares the inference nodes and there "
                        f"are {inf_nodes}")


def parallelism(r: Recipe) -> Parallelism:
    """A judge server: tp GPUs on one node (no data parallel of its own: more servers instead)."""
    assert r.judge is not None, "asked only for a recipe with [judge]"
    return Parallelism("judge", r.judge.tp, by_tp=True)


def check_template(r: Recipe) -> None:
    """Placeholders the built-in environment's tasks cannot fill (a custom one's are checked as it scores)."""
    o = r.orchestrator
    if o is None or o.environment != "judge":
        return
    source = o.environment_args.get("prompts_from")
    if not isinstance(source, str) or source not in envs.BUILTIN or source == "judge":
        return  # a dataset's fields are known when the orchestrator reads it
    task = envs.BUILTIN[source]().prompts(random.Random(0), 1)[0]
    have = sorted({*task, "completion"})
    settings = judge_settings(r)
    assert settings is not None, "a recipe whose environment is 'judge' has [judge] (checked before)"
    for name in template_fields(settings.template):
        if name not in have:
            raise UserError("judge.template", f"placeholder {{{name}}} is not a field of {source!r} tasks; "
                            f"they have {', '.join('{' + h + '}' for h in have)}")


def resolve(r: Recipe) -> Recipe:
    return r


def serves(r: Recipe) -> bool:
    return r.judge is not None


def first_index(ctx: Context) -> int:
    """The first per-node server port index the judge may use: after the inference servers' on shared nodes."""
    return 0 if ctx.judge.placement == "own" else ctx.spec("inference").tasks_per_node


def place(ctx: Context) -> None:
    """Where the judge's servers go: its own het group, or GPUs of the inference nodes after
    inference's and the trainer's (the vLLM engine's ``placement.inference`` made that slot shared)."""
    r, j = ctx.r, ctx.judge
    gpus = j.gpus_per_node or j.tp
    if j.placement == "own":
        g = ctx.group("judge", j.nodes, r.slurm.gpus_per_node)
        ctx.slots["judge"] = Slot(g.index, 0, j.nodes, tuple(range(gpus)))
        return
    inf = ctx.slots["inference"]
    taken = [i for s in ctx.slots.values() if s.group == inf.group for i in s.gpus]
    first_gpu = max(taken) + 1
    if first_gpu + gpus > r.slurm.gpus_per_node:
        raise UserError("judge.gpus_per_node", f"{gpus} judge GPUs do not fit beside the {first_gpu} that inference "
                        f"and the trainer take on a node of {r.slurm.gpus_per_node}; lower it, or use placement 'own'")
    ctx.slots["judge"] = Slot(inf.group, 0, j.nodes, tuple(range(first_gpu, first_gpu + gpus)), shared=True)


def command(ctx: Context) -> tuple[Arg, ...]:
    """The judge's vLLM server: the inference servers' entry point with the judge's model and engine flags
    (the policy's node-local copy when it serves the policy's model.path)."""
    r, j = ctx.r, ctx.judge
    path = ctx.model_path() if j.model.path == r.model.path else None
    args: list[Arg] = vllm.serve_args(j.model, j.tp, path)
    for field in type(j.model).model_fields:  # [judge.model] is a [model]; the rest of [model] is for the policy
        if field not in SERVED and changed(j.model, field):
            raise UserError(f"judge.model.{field}", f"applies to [model] only; the judge's server reads "
                            f"{', '.join('judge.model.' + n for n in SERVED)}")
    if j.kind == "reward_model":
        args += ["--runner", "pooling"]  # *ForSequenceClassification: /classify returns the score
    args += vllm.engine_args(j.model, j) + vllm.otlp_args(ctx.r.env, j.env)
    if ctx.inference.auth == "job_secret":
        args += ["--middleware", vllm.AUTH_MIDDLEWARE]
    return (*ctx.py, *vllm.ENTRY, *args, *j.extra_args)


def build(ctx: Context) -> None:
    """The judge component (after the inference servers, whose ports it follows on shared nodes)."""
    r, j = ctx.r, ctx.judge
    where, first = ctx.slots["judge"], first_index(ctx)
    shape = Slice(span=1, per_node=parallel.per_node(parallelism(r), len(where.gpus)), gpus=j.tp)
    per_node = shape.per_node
    if first + per_node > ports.MAX_LOCAL:
        raise UserError("judge.gpus_per_node", f"{first + per_node} servers per node with the inference servers; at "
                        f"most {ports.MAX_LOCAL} are supported")
    instances = tuple(
        Instance(rank=node * per_node + k, node=node, local=k, gpus=gpus, ports={"http": f"server_{first + k}"})
        for node, k, gpus in shape.tasks(where.gpus, where.nodes)
    )
    env: list = sorted(j.env.items())
    if "VLLM_PORT" not in j.env:
        env.append(vllm.internal_ports(first))
    cmd = command(ctx)
    # ready means serving: one completion first (a reward model, --runner pooling, has none)
    completion = None if vllm.pooling(list(cmd)) else j.model.served_model_name
    ctx.add(Spec(
        name="judge", role="judge", group=where.group, slot=where, first_node=0, nodes=where.nodes,
        tasks_per_node=per_node, gpus_per_node=len(where.gpus), stage=2, main=False, fail_fast=True, critical=j.critical,
        health=Health(kind="http", ports=tuple(f"server_{first + k}" for k in range(per_node)),
                      timeout=j.startup_timeout, urls_var="URLS_JUDGE"),
        instances=instances, reads_model=j.model.path == r.model.path,
        task=ctx.task(
            Supervisor("judge", gpus=shell.gpu_slice(where.gpus[0], j.tp, True), ready=shell.url("http", vllm.PORT),
                       ready_completion=completion, fail_on=tuple(j.fail_on), **restart_of(j)),
            prelude=[*shell.declare("host", "port"), shell.HOST_LINE, f"port={shell.per_task('server', first)}"],
            env=env, command=cmd,
        ),
    ))


def orchestrator_words(ctx: Context) -> tuple[list[str], tuple[Arg, ...]]:
    """(prelude lines, the orchestrator's --judge-urls words) that hand it the judge's URLs; none without a judge."""
    if not ctx.has("judge"):
        return [], ()
    return ([*shell.declare(arrays=("judges",)), 'read -ra judges <<<"${URLS_JUDGE}"'], (Sh(sh="${judges[@]}"),))
