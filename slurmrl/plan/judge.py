"""The judge: a vLLM server that scores rollouts, placed like any inference component.

``[judge]`` in a recipe: its own het group (``placement = "own"``) or GPUs of the inference nodes
after inference's and the trainer's (``"inference"``); ``tp`` GPUs per server, ``gpus_per_node / tp``
servers per node, each on a port of the server block after the inference servers of its node. Its
real vLLM command line stands in job.sbatch (``--runner pooling`` for a reward model). It starts
with the inference servers, is ready when /health answers, fails the job when it exits, and the
orchestrator gets its URLs from its ready files (``--judge-urls "${judges[@]}"``).
"""

from __future__ import annotations

import random
from dataclasses import replace

from slurmrl import envs, ports
from slurmrl.errors import UserError
from slurmrl.plan import shell, vllm
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.placement import Slot
from slurmrl.plan.rules import changed
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.roles import judge_settings
from slurmrl.settings.judge import template_fields

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
    for name in type(j.model).model_fields:  # [judge.model] is a [model]; the rest of [model] is for the policy
        if name not in SERVED and changed(j.model, name):
            raise UserError(f"judge.model.{name}", f"applies to [model] only; the judge's server reads "
                            f"{', '.join('judge.model.' + n for n in SERVED)}")
    if j.kind == "reward_model":
        for name in GENERATIVE_ONLY:
            if changed(j, name):
                raise UserError(f"judge.{name}", "only applies to kind 'generative' (a reward model returns its score)")
    gpn = r.slurm.gpus_per_node
    gpus = j.gpus_per_node or j.tp
    if j.tp > gpn:
        raise UserError("judge.tp", f"tp={j.tp} needs more than the {gpn} GPUs of one node")
    if gpus > gpn:
        raise UserError("judge.gpus_per_node", f"{gpus} is more than the {gpn} GPUs per node (slurm.gpus_per_node)")
    if gpus % j.tp:
        raise UserError("judge.tp", f"tp={j.tp} does not divide the judge's {gpus} GPUs per node")
    if j.placement == "inference":
        inf = r.inference
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
    check_template(r)


def check_template(r: Recipe) -> None:
    """Placeholders the built-in environment's tasks cannot fill (a custom one's are checked as it scores)."""
    j, o = r.judge, r.orchestrator
    if o is None or o.environment != "judge":
        return
    source = o.environment_args.get("prompts_from")
    if not isinstance(source, str) or source not in envs.BUILTIN or source == "judge":
        return  # a dataset's fields are known when the orchestrator reads it
    task = envs.BUILTIN[source]().prompts(random.Random(0), 1)[0]
    have = sorted({*task, "completion"})
    for name in template_fields(judge_settings(r).template):
        if name not in have:
            raise UserError("judge.template", f"placeholder {{{name}}} is not a field of {source!r} tasks; "
                            f"they have {', '.join('{' + h + '}' for h in have)}")


def slot(b) -> tuple[Slot, int]:
    """Where the judge's servers go, and the first per-node server port index they may use."""
    r, j = b.r, b.r.judge
    gpus = j.gpus_per_node or j.tp
    if j.placement == "own":
        g = b.group("judge", j.nodes, r.slurm.gpus_per_node)
        return Slot(g.index, 0, j.nodes, tuple(range(gpus))), 0
    inf = b.slots["inference"]
    taken = [i for s in b.slots.values() if s.group == inf.group for i in s.gpus]
    first_gpu = max(taken) + 1
    if first_gpu + gpus > r.slurm.gpus_per_node:
        raise UserError("judge.gpus_per_node", f"{gpus} judge GPUs do not fit beside the {first_gpu} that inference "
                        f"and the trainer take on a node of {r.slurm.gpus_per_node}; lower it, or use placement 'own'")
    comp = b.comp("inference")
    if not comp["slot"].shared:  # steps sharing a node ask for all its GPUs; each supervisor narrows to its slice
        comp["slot"] = replace(comp["slot"], shared=True)
        b.slots["inference"] = comp["slot"]
    return Slot(inf.group, 0, j.nodes, tuple(range(first_gpu, first_gpu + gpus)), shared=True), comp["tasks_per_node"]


def command(b) -> tuple[Arg, ...]:
    """The judge's vLLM server: the inference servers' entry point with the judge's model and engine flags."""
    r, j = b.r, b.r.judge
    args: list[Arg] = vllm.serve_args(j.model, j.tp)
    for name in type(j.model).model_fields:  # [judge.model] is a [model]; the rest of [model] is for the policy
        if name not in SERVED and changed(j.model, name):
            raise UserError(f"judge.model.{name}", f"applies to [model] only; the judge's server reads "
                            f"{', '.join('judge.model.' + n for n in SERVED)}")
    if j.kind == "reward_model":
        args += ["--runner", "pooling"]  # *ForSequenceClassification: /classify returns the score
    args += vllm.engine_args(j.model, j)
    if r.inference.auth == "job_secret":
        args += ["--middleware", vllm.AUTH_MIDDLEWARE]
    return (*b.py, *vllm.ENTRY, *args, *j.extra_args)


def place(b) -> None:
    """Add the judge component (after the inference servers, whose ports it follows on shared nodes)."""
    j = b.r.judge
    if j is None:
        return
    where, first = slot(b)
    per_node = len(where.gpus) // j.tp
    if first + per_node > ports.MAX_LOCAL:
        raise UserError("judge.gpus_per_node", f"{first + per_node} servers per node with the inference servers; at "
                        f"most {ports.MAX_LOCAL} are supported")
    b.slots["judge"] = where
    instances = tuple(
        Instance(rank=node * per_node + k, node=node, local=k, gpus=where.gpus[k * j.tp:(k + 1) * j.tp],
                 ports={"http": f"server_{first + k}"})
        for node in range(where.nodes) for k in range(per_node)
    )
    env = sorted(j.env.items())
    b.add(
        name="judge", role="judge", group=where.group, slot=where, first_node=0, nodes=where.nodes,
        tasks_per_node=per_node, gpus_per_node=len(where.gpus), stage=2, main=False, fail_fast=True,
        health=Health(kind="http", ports=tuple(f"server_{first + k}" for k in range(per_node)),
                      timeout=j.startup_timeout, urls_var="URLS_JUDGE"),
        instances=instances,
        task=b.task(
            "judge", prelude=[*shell.declare("host", "port"), shell.HOST_LINE, f"port={shell.per_task('server', first)}"],
            env=env,
            supervisor=b.supervise("judge", gpus=shell.gpu_slice(where.gpus[0], j.tp, True),
                                   ready=shell.url("http", vllm.PORT)),
            command=command(b),
        ),
    )


def orchestrator_words(b) -> tuple[list[str], list[Arg]]:
    """(prelude lines, arguments) that hand the judge's URLs to the orchestrator; none without a judge."""
    if not b.has("judge"):
        return [], []
    return ([*shell.declare(arrays=("judges",)), 'read -ra judges <<<"${URLS_JUDGE}"'],
            ["--judge-urls", Sh(sh="${judges[@]}")])
