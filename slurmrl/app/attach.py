"""`slurmrl attach`: run a command (default: an interactive shell) on the node of a running
component, inside the job's allocation and, when the job uses one, its container.

    srun --overlap --jobid=<job id> [--het-group=<g>] --nodes=1 -w <host> --ntasks=1
         [--pty] [the job's Pyxis flags] CMD...

How Slurm 22.05 takes this (tried on the local cluster): ``--jobid`` must be the job's own id,
the het job's leader for a het job (``<id>+<k>`` is not a number, and a het component's own
job id is refused: "Job not heterogeneous job leader"); ``--het-group`` then picks the component
(without it srun says "No directives to start application on any available hetjob
components"). ``-w`` must be a node of that component. ``--overlap`` lets the step share the
CPUs, memory and GPUs the running steps hold, so it starts at once. The command runs with the
job's ``SLURM_JOB_ID`` (the leader's, in every het group) and, like every step, the GPUs of the
allocation on that node.

The host: ``--task T`` takes it from the task's ready file (the URL it serves at) when it has
one; otherwise, and for ``--node N``, it is node ``first_node + N`` of the component's het group
in the allocation's node list (as the job script's ``NODES_G<g>``). The container: the
``CONTAINER`` array of job.sbatch (the script is the truth; the plan's flags if it has none
readable), ``--container-name`` included, so Pyxis joins the container the component runs in
rather than making a new one.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from urllib.parse import urlsplit

from slurmrl import pydantic_plugins
from slurmrl.app.cluster import on_cluster
from slurmrl.errors import UserError
from slurmrl.plan.model import Component, Plan
from slurmrl.plan.stored import load_plan
from slurmrl.rundir import jobs
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.ready import read_ready
from slurmrl.slurm import tools
from slurmrl.slurm.watch import Snapshot, Watch

SHELL = ("bash",)  # the default command: an interactive shell on a pty
OPTIONS = {"--node": "node", "--task": "task", "--cluster": "cluster"}


def split_command(rest: list[str], node: int | None, task: int | None,
                  cluster: str | None = None) -> tuple[int | None, int | None, list[str], str | None]:
    """argparse hands everything after COMPONENT to ``rest`` (``--node 1 -- hostname``): the
    options before ``--`` (or before the first word that is not one), then the command."""
    values: dict[str, int | None] = {"node": node, "task": task}
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            i += 1
            break
        name, eq, value = word.partition("=")
        if name not in OPTIONS:
            if word.startswith("-"):
                raise UserError(word, "unknown option; attach takes --node N or --task T (and --cluster NAME), "
                                      "then -- CMD...")
            break
        if not eq:
            if i + 1 >= len(rest):
                raise UserError(name, "needs a value")
            value = rest[i + 1]
            i += 1
        if name == "--cluster":
            cluster = value
        elif not re.fullmatch(r"\d+", value):
            raise UserError(name, f"needs a number, not {value!r}")
        else:
            values[OPTIONS[name]] = int(value)
        i += 1
    return values["node"], values["task"], rest[i:], cluster


def container_flags(run_dir: Path, plan: Plan) -> list[str]:
    """The job's Pyxis flags: the ``CONTAINER=( ... )`` array of job.sbatch, else the plan's."""
    script = read_text(RunDir(run_dir).script, missing="")
    m = re.search(r"^CONTAINER=\(\n(.*?)^\)$", script, re.M | re.S)
    if m:
        try:
            words = shlex.split(m.group(1), comments=True)
        except ValueError:
            words = None
        if words is not None and not any("$" in w or "`" in w for w in words):
            return words
    return list(plan.container_flags)


def component_of(plan: Plan, name: str) -> Component:
    for c in plan.components:
        if c.name == name:
            return c
    raise UserError(name, f"no such component in this job; it has: {', '.join(c.name for c in plan.components)}")


def host_of_url(url: str, hosts: list[str]) -> str | None:
    """The node of ``hosts`` a ready file's URL names (by name, or by its short name)."""
    try:
        name = urlsplit(url).hostname or ""
    except ValueError:
        return None
    if name in hosts:
        return name
    short = name.split(".")[0]
    return next((h for h in hosts if h == short or h.split(".")[0] == short), None)


def pick_host(run_dir: Path, attempt: int, comp: Component, hosts: list[str], node: int | None,
              task: int | None) -> tuple[str, str]:
    """(host, what it is: ``node 1`` / ``task 3``) for the options given (default: node 0)."""
    if task is not None:
        f = RunDir(run_dir).ready_file(attempt, comp.name, task)
        if f.exists():
            url = read_ready(f).url
            host = host_of_url(url, hosts) if url else None
            if host:
                return host, f"task {task}"
        inst = next((i for i in comp.instances if i.rank == task), None)
        if inst is None:
            raise UserError("--task", f"{comp.name} has no task {task} (its tasks: 0-{len(comp.instances) - 1})")
        node = inst.node
        what = f"task {task}"
    else:
        node = node or 0
        if node >= comp.nodes:
            raise UserError("--node", f"{comp.name} runs on {comp.nodes} node(s): --node is 0"
                            f"{'' if comp.nodes == 1 else f'-{comp.nodes - 1}'}, not {node}")
        what = f"node {node}"
    index = comp.first_node + node
    if index >= len(hosts):
        raise UserError("--node", f"{comp.name}'s {what} is node {index} of het group {comp.group}, "
                        f"which has {len(hosts)} node(s) ({','.join(hosts)})")
    return hosts[index], what


def not_running(job_id: str, snap: Snapshot) -> str | None:
    """Why the job cannot be attached to, or None."""
    if not snap.parts:
        return f"job {job_id} is not known to squeue or sacct; attach needs a running job"
    if snap.done:
        return f"job {job_id} has ended ({snap.state}); attach needs a running job"
    if snap.state != "RUNNING":
        return f"job {job_id} is {snap.state}, not running; attach needs a running job"
    return None


def srun_argv(job_id: str, group: int | None, host: str, container: list[str], command: list[str],
              pty: bool) -> list[str]:
    argv = ["srun", "--overlap", f"--jobid={job_id}"]
    if group is not None:
        argv.append(f"--het-group={group}")
    argv += ["--nodes=1", "-w", host, "--ntasks=1", "--job-name=attach"]
    if pty:
        argv.append("--pty")
    return argv + container + command


def srun_env(env: dict[str, str]) -> dict[str, str]:
    """The caller's environment without Slurm's input variables (inside another allocation they
    would shape this step: SLURM_NTASKS, SLURM_CPUS_PER_TASK, ...); SLURM_CONF stays."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def attach(target: str, component: str, node: int | None, task: int | None, command: list[str]) -> int:
    run_dir = jobs.run_dir_arg(target)
    job_id = jobs.last_job(run_dir)
    plan = load_plan(run_dir)
    if plan is None:
        raise UserError(str(run_dir), "has no plan.json; re-render the run dir")
    comp = component_of(plan, component)
    if node is not None and task is not None:
        raise UserError("--task", "give --node or --task, not both")
    for flag, value in (("--node", node), ("--task", task)):
        if value is not None and value < 0:
            raise UserError(flag, f"needs a number from 0, not {value}")
    snap = Watch(job_id).snapshot()
    why = not_running(job_id, snap)
    if why:
        raise UserError(None, why)
    het = any("+" in p.id for p in snap.parts)
    part = next((p for p in snap.parts if p.group == comp.group), None)
    if part is None or (het and "+" not in part.id):
        raise UserError(component, f"het group {comp.group} of job {job_id} is not in squeue or sacct")
    if part.state != "RUNNING":
        raise UserError(None, f"het group {comp.group} ({component}) of job {job_id} is {part.state}; "
                              "attach needs it running")
    hosts = tools.hostnames(part.nodes)
    where = tools.transport()
    where.pull(run_dir)  # --cluster: the ready files the job wrote there
    attempt = (RunDir(run_dir).attempts() or [0])[-1]
    host, what = pick_host(run_dir, attempt, comp, hosts, node, task)
    pty = not command and sys.stdin.isatty()
    argv = srun_argv(job_id, comp.group if het else None, host, container_flags(run_dir, plan),
                     command or list(SHELL), pty=pty)
    step = snap.step(comp.name)
    note = f" (its step is {step.state})" if step is not None and step.state != "RUNNING" else ""
    print(f"slurmrl: {component} {what} on {host}{note}: {shlex.join(argv)}", file=sys.stderr, flush=True)
    where.exec(argv, srun_env(pydantic_plugins.child_env() or dict(os.environ)), pty=pty)
    return 0  # not reached


def cmd_attach(args) -> int:
    # argparse leaves options written after COMPONENT in the command
    args.node, args.task, args.cmd, args.cluster = split_command(args.cmd, args.node, args.task, args.cluster)
    with on_cluster(args):
        return attach(args.run_dir, args.component, args.node, args.task, args.cmd)
