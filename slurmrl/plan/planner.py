"""recipe -> plan. Pure: no I/O, no clock, no environment. Same recipe, same plan.

This module assembles; each piece decides one thing: ``placement`` (het groups, the trainer's nodes),
``engines/`` (one package per engine family: vLLM's servers, Dynamo, SGLang, the judge, behind one
protocol; each owns its checks, placement and command lines), ``parallel`` (tp x dp on nodes),
``services`` (vllm-router), ``training`` (trainer, orchestrator), ``benchmark``, ``staging``,
``directives`` (#SBATCH lines) and ``shell`` (shell words). Builders add frozen ``spec.Spec`` objects to a
``context.Context``; this module then splits CPUs, writes srun options and makes the ``Plan``.
"""

from __future__ import annotations

from dataclasses import replace

from slurmrl import ports
from slurmrl.contract import job_env
from slurmrl.errors import UserError
from slurmrl.plan import (
    benchmark,
    collector,
    engines,
    log_env,
    placement,
    rules,
    shell,
    staging,
    topology,
    training,
)
from slurmrl.plan.context import Context, Group
from slurmrl.plan.directives import group_directives
from slurmrl.plan.model import Arg, Cat, Component, HetGroup, Plan, Sh, Stage, StopStep
from slurmrl.plan.spec import Spec
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.slurm_values import signal_name, signal_seconds, time_seconds

# Stages, in start order. Each waits for the previous stage's readiness checks.
STAGES = (
    (0, "head-node services"),
    (1, "KV store clients"),
    (2, "inference servers"),
    (3, "router"),
    (4, "trainer and orchestrator"),
    (5, "benchmark"),
)


class _Builder:
    """Assembles a ``Plan`` from what the builders put into the ``Context``."""

    def __init__(self, r: Recipe, run_dir: str, preflight: bool, join: str | None = None):
        self.r = r
        self.run_dir = run_dir
        self.join = {job_env.JOIN_RUN_DIR: join} if join else {}  # a joiner job's servers register there
        self.ctx = Context(r, run_dir, preflight)

    # ---- cpu split ----------------------------------------------------------------------
    def split_cpus(self, specs: list[Spec]) -> list[Spec]:
        """CPUs per task of each GPU component: what services leave on a node, shared by GPU count."""
        slots = [s.slot for s in specs if s.slot]
        out = []
        for c in specs:
            s = c.slot
            if s is None:
                out.append(c)
                continue
            g = self.ctx.groups[s.group]
            shares = []
            for node in range(s.first_node, s.first_node + s.nodes):
                free = self.r.slurm.cpus_per_node - g.reserved.get(node, 0)
                total = sum(len(o.gpus) for o in slots if o.group == s.group and o.first_node <= node < o.first_node + o.nodes)
                shares.append(free * len(s.gpus) // total)
            per_task = min(shares) // c.tasks_per_node
            if per_task < 1:
                raise UserError(
                    "slurm.cpus_per_node",
                    f"{self.r.slurm.cpus_per_node} CPUs per node are too few for {c.tasks_per_node} "
                    f"{c.name} tasks per node in group {g.name!r}; raise it",
                )
            out.append(replace(c, cpus_per_task=per_task))
        return out

    def warn_early_signal(self) -> None:
        """The warning signal must not fire before the servers may take their startup_timeout."""
        inf, s = self.r.inference, self.r.slurm
        limit = time_seconds(s.time)
        if inf is None or limit is None:  # no time limit: no warning signal
            return
        fires_at = limit - signal_seconds(s.signal)
        if fires_at < inf.startup_timeout:
            self.ctx.warnings.append(
                f"slurm.signal {s.signal} fires {max(fires_at, 0)} s into a {s.time} job, before "
                f"inference.startup_timeout ({inf.startup_timeout} s) is up: a job that is not ready by then ends "
                "without a requeue; raise slurm.time or lower startup_timeout"
            )

    @staticmethod
    def thread_pools(specs: list[Spec]) -> list[Spec]:
        """One OpenMP thread pool per trainer process, sized to its CPUs."""
        out = []
        for c in specs:
            if c.role == "trainer" and not any(k == "OMP_NUM_THREADS" for k, _ in c.task.env):
                assert c.slot is not None, "the trainer's spec has its slot (training.trainer)"
                omp = str(max(1, c.cpus_per_task // len(c.slot.gpus)))
                c = replace(c, task=c.task.model_copy(update={"env": (("OMP_NUM_THREADS", omp), *c.task.env)}))
            out.append(c)
        return out

    def trim_gpus(self) -> None:
        """Ask Slurm only for the GPUs the plan uses (others may share the node)."""
        for g in self.ctx.groups:
            used = [i for c in self.ctx.specs if c.slot and c.group == g.index for i in c.slot.gpus]
            if g.gpus_per_node:
                g.gpus_per_node = max(used) + 1 if used else 0

    # ---- assemble -----------------------------------------------------------------------
    def build(self) -> Plan:
        r, ctx = self.r, self.ctx
        placement.layout(ctx)  # the trainer's nodes, or the one node it shares with inference
        for engine in engines.ENGINES:  # vLLM servers and router, or Dynamo; then the judge (one registry)
            if engine.serves(r):
                engine.place(ctx)
                engine.build(ctx)
        benchmark.benchmark(ctx)  # after the router or Dynamo's frontend: what it loads
        if r.trainer is not None:
            training.trainer(ctx)
        if r.orchestrator is not None:
            training.orchestrator(ctx)
        collector.collector(ctx)  # last: it scrapes what the others expose
        ctx.staging = staging.steps(r, ctx.specs, ctx.groups, ctx.py, ctx.preflight)
        topology.check(r, {g.name: g.nodes for g in ctx.groups})
        specs = self.thread_pools(self.split_cpus(ctx.specs))
        self.warn_early_signal()
        self.trim_gpus()
        comps = [self.component(c) for c in sorted(specs, key=lambda c: c.stage)]
        stage_ids = sorted({c.stage for c in comps})
        groups = tuple(
            HetGroup(
                index=g.index, name=g.name, nodes=g.nodes, gpus_per_node=g.gpus_per_node,
                cpus_per_node=self._group_cpus(g), roles=tuple(g.roles),
                directives=group_directives(r, g.index, g.nodes, g.gpus_per_node, self._group_cpus(g), self.run_dir)
                + topology.directives(r, g.name),
                claim_srun=self.claim_srun(g),
                check_srun=self.check_srun(g) if engines.leftover_check(r) else (),  # Dynamo's wide-EP: /dev/shm
                node_srun=self.node_step(g, "nodes"),  # every job: earlier jobs' leftovers ended, health probe
            )
            for g in ctx.groups
        )
        return Plan(
            name=r.name, kind=r.kind, preflight=ctx.preflight, job_name=r.slurm.job_name or r.name, groups=groups,
            components=tuple(comps),
            stages=tuple(
                Stage(index=i, title=dict(STAGES)[s], components=tuple(c.name for c in comps if c.stage == s))
                for i, s in enumerate(stage_ids)
            ),
            ports={k: ports.offset(k) for k in sorted(_ports_used(comps), key=ports.offset)},
            port_base=r.placement.port_base,
            container_flags=container_flags(r, self.run_dir),
            python=ctx.py, venv=r.python.venv, modules=tuple(r.python.modules), setup=tuple(r.python.setup),
            env={**log_env.job_env(r.log.level, log_env.env_maps(r)), **r.env, **self.join}, services=tuple(c.name for c in comps if c.stage in (0, 3)),
            requeue=r.slurm.requeue, max_requeues=r.slurm.max_requeues,
            max_total_seconds=time_seconds(r.slurm.max_total_time) if r.slurm.max_total_time else None,
            signal=signal_name(r.slurm.signal), grace_seconds=r.slurm.grace_seconds,
            stop_order=stop_order(comps, r.slurm.grace_seconds),
            warnings=tuple(ctx.warnings),
            image_import=staging.image_import(r), slurmrl_check=staging.slurmrl_check(r, ctx.groups, ctx.py),
            staging=ctx.staging,
            nvlink_domain=tuple(g.index for g in ctx.groups if g.name in r.slurm.nvlink_domain),
        )

    def component(self, c: Spec) -> Component:
        """A spec as the plan shows it: a step sharing its node's GPUs asks for all of them."""
        shared = c.slot is not None and c.slot.shared
        gpus = self.ctx.groups[c.group].gpus_per_node if shared else c.gpus_per_node
        return Component(
            name=c.name, role=c.role, group=c.group, first_node=c.first_node, nodes=c.nodes,
            tasks_per_node=c.tasks_per_node, cpus_per_task=c.cpus_per_task, gpus_per_node=gpus, overlap=shared,
            stage=c.stage, main=c.main, critical=c.critical,
            orchestrated=c.orchestrated, task=c.task, health=c.health, instances=c.instances, settings=c.settings,
            mpi=c.mpi, srun=self.srun_args(c, gpus, shared),
        )

    def srun_args(self, c: Spec, gpus: int, overlap: bool) -> tuple:
        """One srun builder for every component."""
        args: list = []
        if len(self.ctx.groups) > 1:
            args.append(f"--het-group={c.group}")
        args += [
            f"--job-name={c.name}", f"--nodes={c.nodes}", f"--relative={c.first_node}",
            f"--ntasks={c.nodes * c.tasks_per_node}", f"--ntasks-per-node={c.tasks_per_node}",
            f"--cpus-per-task={c.cpus_per_task}", "--exact",
        ]
        if overlap:
            args.append("--overlap")  # shares this node's GPUs with another step; each takes its slice
        if gpus and self.r.slurm.gpu_request == "gres":
            args.append(f"--gres=gpu:{gpus}")
        elif gpus:
            args.append(f"--gpus-per-node={gpus}")
        elif self.ctx.groups[c.group].gpus_per_node:
            args.append("--gpus-per-node=0")  # no GPUs, so it never waits for a GPU step (--gres=none is refused)
        if c.mpi:
            args.append(f"--mpi={c.mpi}")
        args.append(f"--kill-on-bad-exit={int(c.fail_fast)}")
        args.append(Sh(sh=f"--output=${{LOG_DIR}}/{c.name}.%t.log"))
        return tuple(args)

    def claim_srun(self, g: Group) -> tuple:
        """The short step that claims the job's port block on every node of group ``g``."""
        args: list = [f"--het-group={g.index}"] if len(self.ctx.groups) > 1 else []
        args += ["--job-name=ports", f"--nodes={g.nodes}", f"--ntasks={g.nodes}", "--ntasks-per-node=1",
                 "--cpus-per-task=1", "--overlap"]
        if g.gpus_per_node:
            args.append("--gpus-per-node=0")
        args.append(Sh(sh=f"--output=${{LOG_DIR}}/ports.g{g.index}.%t.log"))
        return tuple(args)

    def check_srun(self, g: Group) -> tuple:
        """The short step that checks every node of group ``g`` for an earlier job's leftovers,
        with the group's GPUs (so nvidia-smi sees the ones this job got)."""
        return self.node_step(g, "leftovers")

    def node_step(self, g: Group, name: str) -> tuple:
        """A short step with one task on every node of group ``g`` and the group's GPUs (so nvidia-smi
        sees the ones this job got); its output in LOG_DIR/<name>.g<index>.<task>.log."""
        args: list = [f"--het-group={g.index}"] if len(self.ctx.groups) > 1 else []
        args += [f"--job-name={name}", f"--nodes={g.nodes}", f"--ntasks={g.nodes}", "--ntasks-per-node=1",
                 "--cpus-per-task=1", "--overlap"]
        if g.gpus_per_node:
            args.append(f"--gres=gpu:{g.gpus_per_node}" if self.r.slurm.gpu_request == "gres"
                        else f"--gpus-per-node={g.gpus_per_node}")
        args.append(Sh(sh=f"--output=${{LOG_DIR}}/{name}.g{g.index}.%t.log"))
        return tuple(args)

    def _group_cpus(self, g: Group) -> int:
        if g.gpus_per_node:
            return self.r.slurm.cpus_per_node
        assert self.r.orchestrator is not None, "the one group without GPUs is the orchestrator's own"
        return self.r.orchestrator.cpus


SERVICE_GRACE_S = 10  # servers and services need no checkpoint: time to exit cleanly


def stop_order(comps: list[Component], grace: int) -> tuple[StopStep, ...]:
    """A planned stop ends components in reverse start order, so the orchestrator stops before
    the servers it calls and the servers before the router and stores they use. Stages with
    main components (the trainer checkpoints) get the full grace, the rest a short one."""
    stages = sorted({c.stage for c in comps}, reverse=True)
    out = []
    for s in stages:
        names = tuple(c.name for c in comps if c.stage == s)
        main = any(c.main for c in comps if c.stage == s)
        out.append(StopStep(components=names, seconds=grace if main else min(grace, SERVICE_GRACE_S), full_grace=main))
    return tuple(out)


def _ports_used(comps: list[Component]) -> set[str]:
    """Every port-table name an instance listens on or the script's shell refers to."""
    names: set[str] = set()
    for c in comps:
        for i in c.instances:
            names.update(i.ports.values())
        t = c.task
        for text in (*t.prelude, *[_text(a) for a in (*t.supervisor, *t.command, *[v for _, v in t.env])]):
            names.update(shell.port_refs(text))
    return names


def _text(a: Arg) -> str:
    if isinstance(a, Sh):
        return a.sh
    if isinstance(a, Cat):
        return "".join(_text(p) for p in a.parts)
    return ""


def container_flags(r: Recipe, run_dir: str) -> tuple[str, ...]:
    c = r.container
    if c is None:
        return ()
    mounts = [f"{run_dir}:{run_dir}", *c.mounts, *staging.extra_mounts(r)]
    flags = [f"--container-image={staging.container_image(r)}", f"--container-mounts={','.join(mounts)}"]
    if c.workdir:
        flags.append(f"--container-workdir={c.workdir}")
    if c.env:
        flags.append(f"--container-env={','.join(c.env)}")
    if c.name:
        flags.append(f"--container-name={c.name}")
    for value, yes, no in (
        (c.remap_root, "--container-remap-root", "--no-container-remap-root"),
        (c.mount_home, "--container-mount-home", "--no-container-mount-home"),
        (c.writable, "--container-writable", "--container-readonly"),
        (c.entrypoint, "--container-entrypoint", "--no-container-entrypoint"),
    ):
        if value is not None:
            flags.append(yes if value else no)
    return tuple(flags)


def plan(recipe: Recipe, run_dir: str, preflight: bool = False, join: str | None = None) -> Plan:
    """Place every component of ``recipe``; ``run_dir`` is the absolute run folder the job will use.

    With ``preflight`` every component runs ``slurmrl.runtime.steps.probe`` in the same layout; with ``join``
    (a joiner job, ``slurmrl.plan.join``) its servers register in that run dir once ready.
    """
    rules.check(recipe)
    engines.check(recipe)  # each engine family's rules (vLLM's include a LoRA policy's)
    staging.check(recipe)
    return _Builder(engines.resolve(recipe), run_dir, preflight, join).build()
