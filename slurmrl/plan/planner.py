"""recipe -> plan. Pure: no I/O, no clock, no environment. Same recipe, same plan.

This module assembles; each piece decides one thing: ``placement`` (het groups, nodes, GPU
positions), ``servers`` (vLLM servers), ``services`` (router, Mooncake), ``training`` (trainer,
orchestrator), ``directives`` (#SBATCH lines), ``vllm`` and ``shell`` (command lines).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurmrl.errors import UserError
from slurmrl import ports
from slurmrl.plan import benchmark, dynamo, judge, lora, placement, rules, servers, services, serving, shell, staging, topology, training
from slurmrl.plan.directives import group_directives
from slurmrl.plan.model import Arg, Cat, Component, HetGroup, Plan, Sh, Stage, StopStep, Task
from slurmrl.recipe.schema import Recipe, time_seconds

# Stages, in start order. Each waits for the previous stage's readiness checks.
STAGES = (
    (0, "head-node services"),
    (1, "KV store clients"),
    (2, "inference servers"),
    (3, "router"),
    (4, "trainer and orchestrator"),
    (5, "benchmark"),
)


@dataclass
class _Group:
    index: int
    name: str
    nodes: int
    gpus_per_node: int
    roles: list[str] = field(default_factory=list)
    reserved: dict[int, int] = field(default_factory=dict)  # node -> CPUs taken by services


class _Builder:
    def __init__(self, r: Recipe, run_dir: str, preflight: bool):
        self.r = r
        self.run_dir = run_dir
        self.preflight = preflight
        self.groups: list[_Group] = []
        self.comps: list[dict] = []
        self.warnings: list[str] = []
        self.slots: dict[str, placement.Slot] = {}
        self.staging: tuple = ()  # model.stage: the copy steps (slurmrl.plan.staging)
        self.py = (
            ("uv", "run", "--project", r.python.uv_project, r.python.executable)
            if r.python.uv_project
            else (r.python.executable,)
        )

    # ---- groups and components ----------------------------------------------------------
    def group(self, name: str, nodes: int, gpus_per_node: int) -> _Group:
        g = _Group(len(self.groups), name, nodes, gpus_per_node)
        self.groups.append(g)
        return g

    def reserve(self, g: _Group, node: int, cpus: int, what: str) -> None:
        g.reserved[node] = g.reserved.get(node, 0) + cpus
        if g.reserved[node] >= self.r.slurm.cpus_per_node and g.gpus_per_node > 0:
            raise UserError(
                "slurm.cpus_per_node",
                f"{self.r.slurm.cpus_per_node} CPUs per node leave nothing for the GPU steps on node {node} "
                f"of group {g.name!r} after {what}; raise it",
            )

    def add(self, **c) -> None:
        g = self.groups[c["group"]]
        label = c["name"] if c["role"] == "inference" else c["role"]
        if label not in g.roles:
            g.roles.append(label)
        c.setdefault("overlap", False)
        c.setdefault("main", False)
        c.setdefault("fail_fast", True)
        self.comps.append(c)

    def comp(self, name: str) -> dict:
        return next(c for c in self.comps if c["name"] == name)

    def has(self, name: str) -> bool:
        return any(c["name"] == name for c in self.comps)

    # ---- what each task runs ------------------------------------------------------------
    def supervise(self, name: str, gpus: str | Sh | None = None, ready: Sh | None = None,
                  cuda_runtime: bool = False, heartbeat: int = 0) -> tuple[Arg, ...]:
        """``python -m slurmrl.runtime.steps.supervise NAME [--gpus FIRST:COUNT] [--ready URL] --``"""
        argv: list[Arg] = [*self.py, "-m", "slurmrl.runtime.steps.supervise", name]
        if gpus is not None:
            argv += ["--gpus", gpus]
        if ready is not None:
            argv += ["--ready", ready]
        if heartbeat:
            argv += ["--heartbeat", str(heartbeat)]
        if cuda_runtime:
            argv.append("--cuda-runtime")
        return (*argv, "--")

    def task(self, name: str, command: tuple, supervisor: tuple = (), prelude=(), env=()) -> Task:
        """The task function's body; in a preflight every component runs the probe instead."""
        if self.preflight:
            return Task(env=tuple(env), command=(*self.py, "-m", "slurmrl.runtime.steps.probe", name))
        return Task(prelude=tuple(prelude), env=tuple(env), supervisor=supervisor, command=tuple(command))

    # ---- cpu split ----------------------------------------------------------------------
    def split_cpus(self) -> None:
        """CPUs per task of each GPU component: what services leave on a node, shared by GPU count."""
        slots = [(c, c["slot"]) for c in self.comps if c.get("slot")]
        for c, s in slots:
            g = self.groups[s.group]
            shares = []
            for node in range(s.first_node, s.first_node + s.nodes):
                free = self.r.slurm.cpus_per_node - g.reserved.get(node, 0)
                total = sum(len(o.gpus) for _, o in slots if o.group == s.group and o.first_node <= node < o.first_node + o.nodes)
                shares.append(free * len(s.gpus) // total)
            per_task = min(shares) // c["tasks_per_node"]
            if per_task < 1:
                raise UserError(
                    "slurm.cpus_per_node",
                    f"{self.r.slurm.cpus_per_node} CPUs per node are too few for {c['tasks_per_node']} "
                    f"{c['name']} tasks per node in group {g.name!r}; raise it",
                )
            c["cpus_per_task"] = per_task

    def warn_early_signal(self) -> None:
        """The warning signal must not fire before the servers may take their startup_timeout."""
        inf, s = self.r.inference, self.r.slurm
        if inf is None:
            return
        fires_at = time_seconds(s.time) - int(s.signal.split("@")[1])
        if fires_at < inf.startup_timeout:
            self.warnings.append(
                f"slurm.signal {s.signal} fires {max(fires_at, 0)} s into a {s.time} job, before "
                f"inference.startup_timeout ({inf.startup_timeout} s) is up: a job that is not ready by then ends "
                "without a requeue; raise slurm.time or lower startup_timeout"
            )

    def thread_pools(self) -> None:
        """One OpenMP thread pool per trainer process, sized to its CPUs."""
        for c in self.comps:
            if c["role"] == "trainer" and not any(k == "OMP_NUM_THREADS" for k, _ in c["task"].env):
                omp = str(max(1, c["cpus_per_task"] // len(c["slot"].gpus)))
                c["task"] = c["task"].model_copy(update={"env": (("OMP_NUM_THREADS", omp), *c["task"].env)})

    def trim_gpus(self) -> None:
        """Ask Slurm only for the GPUs the plan uses (others may share the node)."""
        for g in self.groups:
            used = [i for c in self.comps if c.get("slot") and c["group"] == g.index for i in c["slot"].gpus]
            if g.gpus_per_node:
                g.gpus_per_node = max(used) + 1 if used else 0

    # ---- assemble -----------------------------------------------------------------------
    def build(self) -> Plan:
        r = self.r
        self.slots = dynamo.layout(self) if dynamo.enabled(r) else placement.layout(self)
        if dynamo.enabled(r):
            dynamo.components(self)  # etcd, NATS, frontend and workers in place of servers and router
        elif r.inference is not None:
            servers.inference(self)
            services.mooncake(self)
            services.router(self)
        benchmark.benchmark(self)  # after the router or Dynamo's frontend: what it loads
        judge.place(self)  # after the inference servers: on shared nodes its ports follow theirs
        if r.trainer is not None:
            training.trainer(self)
        if r.orchestrator is not None:
            training.orchestrator(self)
        serving.apply(self)  # ready means serving: the fronts' readiness includes one completion
        staging.apply(self)  # model.stage: servers read the node-local copy the staging steps make
        topology.check(r, {g.name: g.nodes for g in self.groups})
        self.split_cpus()
        self.warn_early_signal()
        self.thread_pools()
        self.trim_gpus()
        comps = []
        for c in sorted(self.comps, key=lambda c: c["stage"]):
            slot = c.pop("slot", None)
            shared = slot is not None and slot.shared
            fail_fast = c.pop("fail_fast")
            c["gpus_per_node"] = self.groups[c["group"]].gpus_per_node if shared else c["gpus_per_node"]
            c["overlap"] = shared
            comps.append(Component(**c, srun=self.srun_args(c, fail_fast)))
        stage_ids = sorted({c.stage for c in comps})
        groups = tuple(
            HetGroup(
                index=g.index, name=g.name, nodes=g.nodes, gpus_per_node=g.gpus_per_node,
                cpus_per_node=self._group_cpus(g), roles=tuple(g.roles),
                directives=group_directives(r, g.index, g.nodes, g.gpus_per_node, self._group_cpus(g), self.run_dir)
                + topology.directives(r, g.name),
                claim_srun=self.claim_srun(g),
                check_srun=self.check_srun(g) if dynamo.enabled(r) else (),  # wide-EP leaves /dev/shm/moe_*
            )
            for g in self.groups
        )
        return Plan(
            name=r.name, kind=r.kind, preflight=self.preflight, job_name=r.slurm.job_name or r.name, groups=groups,
            components=tuple(comps),
            stages=tuple(
                Stage(index=i, title=dict(STAGES)[s], components=tuple(c.name for c in comps if c.stage == s))
                for i, s in enumerate(stage_ids)
            ),
            ports={k: ports.offset(k) for k in sorted(_ports_used(comps), key=ports.offset)},
            port_base=r.placement.port_base,
            container_flags=container_flags(r, self.run_dir),
            python=self.py, venv=r.python.venv, modules=tuple(r.python.modules), setup=tuple(r.python.setup),
            env=dict(r.env), services=tuple(c.name for c in comps if c.stage in (0, 3)),
            requeue=r.slurm.requeue, max_requeues=r.slurm.max_requeues,
            max_total_seconds=time_seconds(r.slurm.max_total_time) if r.slurm.max_total_time else None,
            signal=r.slurm.signal.split("@")[0], grace_seconds=r.slurm.grace_seconds,
            stop_order=stop_order(comps, r.slurm.grace_seconds),
            warnings=tuple(self.warnings),
            image_import=staging.image_import(r), staging=self.staging,
            nvlink_domain=tuple(g.index for g in self.groups if g.name in r.slurm.nvlink_domain),
        )

    def srun_args(self, c: dict, fail_fast: bool) -> tuple:
        """One srun builder for every component."""
        args: list = []
        if len(self.groups) > 1:
            args.append(f"--het-group={c['group']}")
        args += [
            f"--job-name={c['name']}", f"--nodes={c['nodes']}", f"--relative={c['first_node']}",
            f"--ntasks={c['nodes'] * c['tasks_per_node']}", f"--ntasks-per-node={c['tasks_per_node']}",
            f"--cpus-per-task={c['cpus_per_task']}", "--exact",
        ]
        if c["overlap"]:
            args.append("--overlap")  # shares this node's GPUs with another step; each takes its slice
        gpus = c["gpus_per_node"]
        if gpus and self.r.slurm.gpu_request == "gres":
            args.append(f"--gres=gpu:{gpus}")
        elif gpus:
            args.append(f"--gpus-per-node={gpus}")
        elif self.groups[c["group"]].gpus_per_node:
            args.append("--gpus-per-node=0")  # no GPUs, so it never waits for a GPU step (--gres=none is refused)
        if c.get("mpi"):
            args.append(f"--mpi={c['mpi']}")
        args.append(f"--kill-on-bad-exit={int(fail_fast)}")
        args.append(Sh(sh=f"--output=${{LOG_DIR}}/{c['name']}.%t.log"))
        return tuple(args)

    def claim_srun(self, g: _Group) -> tuple:
        """The short step that claims the job's port block on every node of group ``g``."""
        args: list = [f"--het-group={g.index}"] if len(self.groups) > 1 else []
        args += [f"--job-name=ports", f"--nodes={g.nodes}", f"--ntasks={g.nodes}", "--ntasks-per-node=1",
                 "--cpus-per-task=1", "--overlap"]
        if g.gpus_per_node:
            args.append("--gpus-per-node=0")
        args.append(Sh(sh=f"--output=${{LOG_DIR}}/ports.g{g.index}.%t.log"))
        return tuple(args)

    def check_srun(self, g: _Group) -> tuple:
        """The short step that checks every node of group ``g`` for an earlier job's leftovers,
        with the group's GPUs (so nvidia-smi sees the ones this job got)."""
        args: list = [f"--het-group={g.index}"] if len(self.groups) > 1 else []
        args += ["--job-name=leftovers", f"--nodes={g.nodes}", f"--ntasks={g.nodes}", "--ntasks-per-node=1",
                 "--cpus-per-task=1", "--overlap"]
        if g.gpus_per_node:
            args.append(f"--gres=gpu:{g.gpus_per_node}" if self.r.slurm.gpu_request == "gres"
                        else f"--gpus-per-node={g.gpus_per_node}")
        args.append(Sh(sh=f"--output=${{LOG_DIR}}/leftovers.g{g.index}.%t.log"))
        return tuple(args)

    def _group_cpus(self, g: _Group) -> int:
        return self.r.slurm.cpus_per_node if g.gpus_per_node else self.r.orchestrator.cpus


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


def plan(recipe: Recipe, run_dir: str, preflight: bool = False) -> Plan:
    """Place every component of ``recipe``; ``run_dir`` is the absolute run folder the job will use.

    With ``preflight`` every component runs ``slurmrl.runtime.steps.probe`` in the same layout.
    """
    rules.check(recipe)
    dynamo.check(recipe)
    judge.check(recipe)
    staging.check(recipe)
    lora.check(recipe)
    return _Builder(lora.apply(recipe), run_dir, preflight).build()
