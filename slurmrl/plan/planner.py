"""recipe -> plan. Pure: no I/O, no clock, no environment. Same recipe, same plan."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slurmrl.errors import UserError
from slurmrl.plan import ports, rules, vllm
from slurmrl.plan.directives import group_directives
from slurmrl.plan.model import Component, Health, HetGroup, Instance, Plan, Sh, Stage
from slurmrl.recipe.schema import Recipe

# Stages, in start order. Each waits for the previous stage's readiness checks.
STAGES = (
    (0, "head-node services"),
    (1, "KV store clients"),
    (2, "inference servers"),
    (3, "router"),
    (4, "trainer and orchestrator"),
)
SERVICE_CPUS = {"router": 2, "mooncake-master": 1, "mooncake-client": 1}


@dataclass
class _Group:
    index: int
    name: str
    nodes: int
    gpus_per_node: int
    roles: list[str] = field(default_factory=list)
    reserved: dict[int, int] = field(default_factory=dict)  # node -> CPUs taken by services


@dataclass
class _Slot:
    """Where a GPU component goes: a run of nodes in a group and GPU positions on each."""

    group: int
    first_node: int
    nodes: int
    gpus: tuple[int, ...]
    shared: bool = False


class _Builder:
    def __init__(self, r: Recipe, run_dir: str, preflight: bool):
        self.r = r
        self.run_dir = run_dir
        self.preflight = preflight
        self.groups: list[_Group] = []
        self.comps: list[dict] = []
        self.warnings: list[str] = []
        self.py = (
            ("uv", "run", "--project", r.python.uv_project, r.python.executable)
            if r.python.uv_project
            else (r.python.executable,)
        )

    # ---- groups -------------------------------------------------------------------------
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

    def config_path(self, name: str) -> Sh:
        return Sh(sh=f"${{RUN_DIR}}/components/{name}.toml")

    def runtime_argv(self, role: str, name: str) -> tuple:
        """``python -m slurmrl.runtime.<role>``; in a preflight every component runs the probe."""
        module = "probe" if self.preflight else role
        return (*self.py, "-m", f"slurmrl.runtime.{module}", "--config", self.config_path(name))

    def add(self, **c) -> None:
        g = self.groups[c["group"]]
        if c["role"] not in g.roles:
            g.roles.append(c["role"] if c["role"] != "inference" else c["name"])
        c.setdefault("env", {})
        c.setdefault("overlap", False)
        c.setdefault("main", False)
        c.setdefault("checkpoints", False)
        c.setdefault("fail_fast", True)
        self.comps.append(c)

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

    # ---- topology -----------------------------------------------------------------------
    def layout(self) -> dict[str, _Slot]:
        r, gpn = self.r, self.r.slurm.gpus_per_node
        slots: dict[str, _Slot] = {}
        if r.placement.colocate:
            g = self.group("rl", 1, gpn)
            inf, tr = r.inference, r.trainer
            if r.placement.share_gpus:
                n = inf.gpus_per_node or gpn
                slots["inference"] = _Slot(g.index, 0, 1, tuple(range(n)), shared=True)
                slots["trainer"] = _Slot(g.index, 0, 1, tuple(range(tr.gpus_per_node or n)), shared=True)
            else:
                n = inf.gpus_per_node
                t = tr.gpus_per_node if tr.gpus_per_node is not None else gpn - n
                if t < 1 or n + t > gpn:
                    raise UserError(
                        "trainer.gpus_per_node",
                        f"inference takes {n} of the node's {gpn} GPUs, so the trainer cannot have {max(t, 0)}; "
                        "lower inference.gpus_per_node or set placement.share_gpus",
                    )
                slots["inference"] = _Slot(g.index, 0, 1, tuple(range(n)), shared=True)
                slots["trainer"] = _Slot(g.index, 0, 1, tuple(range(n, n + t)), shared=True)
            return slots
        if r.trainer is not None:
            g = self.group("trainer", r.trainer.nodes, gpn)
            slots["trainer"] = _Slot(g.index, 0, g.nodes, tuple(range(r.trainer.gpus_per_node or gpn)))
        inf = r.inference
        if inf is not None and inf.mode == "pd":
            for role in ("prefill", "decode"):
                spec = getattr(inf, role)
                nodes = spec.nodes or math.ceil(spec.replicas * spec.tp / gpn)
                field_ = f"inference.{role}"
                if spec.tp > gpn:
                    raise UserError(f"{field_}.tp", f"tp={spec.tp} needs more than the {gpn} GPUs of one node")
                if spec.replicas % nodes:
                    raise UserError(
                        f"{field_}.replicas",
                        f"{spec.replicas} replicas do not spread evenly over {nodes} nodes; use a multiple of {nodes}",
                    )
                per_node = spec.replicas // nodes
                if per_node * spec.tp > gpn:
                    raise UserError(
                        f"{field_}.nodes",
                        f"{per_node} replicas x tp={spec.tp} per node need {per_node * spec.tp} GPUs; nodes have {gpn}",
                    )
                g = self.group(role, nodes, gpn)
                slots[role] = _Slot(g.index, 0, nodes, tuple(range(per_node * spec.tp)))
        elif inf is not None:
            g = self.group("inference", inf.nodes, gpn)
            slots["inference"] = _Slot(g.index, 0, g.nodes, tuple(range(inf.gpus_per_node or gpn)))
        return slots

    # ---- inference ----------------------------------------------------------------------
    def servers(self, name: str, slot: _Slot, tp: int, dp: int, extra: list[str], env: dict, pd_role: str | None):
        r, inf = self.r, self.r.inference
        n, sg = len(slot.gpus), tp * dp
        where = f"inference.{pd_role}" if pd_role else "inference"
        if inf.mode == "wide_ep":
            if n % tp:
                raise UserError("inference.tp", f"tp={tp} does not divide the {n} inference GPUs per node")
            dp_local = n // tp
            total = dp_local * slot.nodes
            if inf.dp not in (1, total):
                raise UserError(
                    "inference.dp",
                    f"wide-EP over {slot.nodes} nodes x {n} GPUs with tp={tp} has {total} data-parallel ranks, "
                    f"not {inf.dp}; set dp = {total} or leave it out",
                )
            per_node, sg = 1, n
        else:
            if sg > n:
                raise UserError(
                    f"{where}.tp",
                    f"one server needs tp x dp = {sg} GPUs but has {n} per node; "
                    "multi-node servers need mode 'wide_ep'",
                )
            if n % sg:
                raise UserError(f"{where}.tp", f"tp x dp = {sg} does not divide the {n} inference GPUs per node")
            per_node = n // sg
            if per_node > ports.MAX_LOCAL:
                raise UserError(f"{where}.tp", f"{per_node} servers per node; at most {ports.MAX_LOCAL} are supported")
        if r.placement.share_gpus and inf.gpu_memory_utilization is None:
            inf = inf.model_copy(update={"gpu_memory_utilization": 0.45})
            self.warnings.append("inference.gpu_memory_utilization set to 0.45: the trainer shares the GPU")
        off_args, off_env = vllm.offload_args(inf, per_node, slot.group)
        instances = []
        for node in range(slot.nodes):
            for local in range(per_node):
                gpus = slot.gpus[local * sg:(local + 1) * sg]
                iports = {"http": f"server_{local}"}
                args = vllm.common_args(r.model, inf, tp, f"server_{local}")
                ienv = dict(off_env)
                if inf.mode == "wide_ep":
                    ep = inf.expert_parallel is not False
                    args += vllm.wide_ep_args(total, dp_local, node, slot.group, ep)
                    iports["dp_rpc"] = "dp_rpc"
                else:
                    if dp > 1:
                        iports["dp_rpc"] = f"dprpc_{local}"
                    args += vllm.local_dp_args(dp, f"dprpc_{local}")
                    if inf.expert_parallel:
                        args.append("--enable-expert-parallel")
                if pd_role:
                    kv_args, kv_env = vllm.pd_args(inf.kv_connector, pd_role, local, gpus[0], self.slots["prefill"].group)
                    args += kv_args
                    ienv.update(kv_env)
                    iports["kv"] = f"kv_{local}" if inf.kv_connector == "P2pNcclConnector" else f"nixl_{gpus[0]}"
                args += off_args + list(inf.extra_args) + list(extra)
                instances.append(Instance(
                    rank=len(instances), node=node, local=local, gpus=gpus, ports=iports, args=tuple(args), env=ienv,
                ))
        health = Health(
            kind="http",
            ports=tuple(f"server_{i}" for i in range(per_node)),
            first_node_only=inf.mode == "wide_ep",
            timeout=inf.startup_timeout,
        )
        env_ = {**inf.env, **env}
        admin = inf.admin_endpoints if inf.admin_endpoints is not None else r.kind == "rl"
        if admin:
            env_["VLLM_SERVER_DEV_MODE"] = "1"  # pause / reload_weights / resume endpoints
        if inf.max_lora_rank:
            env_["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        self.add(
            name=name, role="inference", group=slot.group, slot=slot, first_node=slot.first_node, nodes=slot.nodes,
            tasks_per_node=per_node, gpus_per_node=len(slot.gpus), stage=2, main=r.kind == "inference",
            fail_fast=r.kind != "inference", argv=self.runtime_argv("inference", name), env=env_, health=health,
            instances=tuple(instances),
            settings={"mode": inf.mode, "pd_role": pd_role or "", "served_model_name": r.model.served_name or r.model.path},
        )

    def inference(self) -> None:
        inf = self.r.inference
        if inf.mode == "pd":
            for role in ("prefill", "decode"):
                spec = getattr(inf, role)
                self.servers(role, self.slots[role], spec.tp, 1, spec.extra_args, spec.env, role)
        else:
            self.servers("inference", self.slots["inference"], inf.tp, inf.dp, [], {}, None)

    def endpoints(self, names: tuple[str, ...]) -> list[dict]:
        out = []
        for c in self.comps:
            if c["name"] in names:
                for i in c["instances"]:
                    if "http" in i.ports and not (c["health"].first_node_only and i.node > 0):
                        out.append({"group": c["group"], "node": c["first_node"] + i.node, "port": i.ports["http"]})
        return out

    def server_names(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.r.inference.mode == "pd" else ("inference",)

    def router(self) -> None:
        inf = self.r.inference
        servers = self.endpoints(self.server_names())
        enabled = inf.router.enabled if inf.router.enabled is not None else (len(servers) > 1 or inf.mode == "pd")
        if not enabled:
            return
        head = self.groups[self.comps_by_name(self.server_names()[0])["group"]]
        self.reserve(head, 0, SERVICE_CPUS["router"], "the router")
        settings = {
            "policy": inf.router.policy,
            "session_header": inf.router.session_header,
            "extra_args": list(inf.router.extra_args),
        }
        if inf.mode == "pd":
            settings["prefill"] = self.endpoints(("prefill",))
            settings["decode"] = self.endpoints(("decode",))
            settings["kv_connector"] = inf.kv_connector
        else:
            settings["workers"] = servers
        self.add(
            name="router", role="router", group=head.index, first_node=0, nodes=1, tasks_per_node=1,
            cpus_per_task=SERVICE_CPUS["router"], gpus_per_node=0, stage=3,
            argv=self.runtime_argv("router", "router"),
            health=Health(kind="http", ports=("router",), first_node_only=True, timeout=300),
            instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={"http": "router", "metrics": "router_metrics"}),),
            settings=settings,
        )

    def mooncake(self) -> None:
        off = self.r.inference.kv_offload
        if off.kind != "mooncake":
            return
        slot = self.slots["inference"]
        g = self.groups[slot.group]
        self.reserve(g, 0, SERVICE_CPUS["mooncake-master"], "the Mooncake master")
        self.add(
            name="mooncake-master", role="mooncake", group=g.index, first_node=0, nodes=1, tasks_per_node=1,
            cpus_per_task=1, gpus_per_node=0, stage=0, argv=self.runtime_argv("mooncake", "mooncake-master"),
            health=Health(kind="tcp", ports=("mooncake_rpc",), first_node_only=True, timeout=120),
            instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={
                "rpc": "mooncake_rpc", "metadata": "mooncake_metadata", "admin": "mooncake_admin"}),),
            settings={"mode": "master"},
        )
        for node in range(slot.nodes):
            self.reserve(g, node, SERVICE_CPUS["mooncake-client"], "the Mooncake client")
        self.add(
            name="mooncake-client", role="mooncake", group=g.index, first_node=0, nodes=slot.nodes, tasks_per_node=1,
            cpus_per_task=1, gpus_per_node=0, stage=1, argv=self.runtime_argv("mooncake", "mooncake-client"),
            health=Health(kind="file", timeout=120),
            instances=tuple(
                Instance(rank=n, node=n, local=0, gpus=(), ports={"client": "mooncake_client"}) for n in range(slot.nodes)
            ),
            settings={
                "mode": "client", "cpu_gb": off.cpu_gb, "disk_path": off.disk_path or "", "disk_gb": off.disk_gb,
                "protocol": off.mooncake_protocol, "device": off.mooncake_device or "",
                "master": {"group": g.index, "node": 0, "port": "mooncake_rpc"},
                "metadata": {"group": g.index, "node": 0, "port": "mooncake_metadata"},
            },
        )

    def comps_by_name(self, name: str) -> dict:
        return next(c for c in self.comps if c["name"] == name)

    # ---- trainer and orchestrator -------------------------------------------------------
    def rl_batch(self) -> int:
        o, t = self.r.orchestrator, self.r.trainer
        batch = o.prompts_per_step * o.rollouts_per_prompt
        if "batch_size" in t.model_fields_set and t.batch_size != batch:
            raise UserError(
                "trainer.batch_size",
                f"RL batches are prompts_per_step x rollouts_per_prompt = {batch}; remove batch_size or make it {batch}",
            )
        return batch

    def trainer(self) -> None:
        r, t = self.r, self.r.trainer
        slot = self.slots["trainer"]
        world = slot.nodes * len(slot.gpus)
        batch = self.rl_batch() if r.kind == "rl" else t.batch_size
        where = "orchestrator.prompts_per_step" if r.kind == "rl" else "trainer.batch_size"
        if batch % (t.micro_batch_size * world):
            raise UserError(
                where,
                f"a batch of {batch} sequences does not split into micro_batch_size {t.micro_batch_size} "
                f"x {world} trainer GPUs",
            )
        head = f"${{NODES_G{slot.group}[{slot.first_node}]}}"
        argv = (
            *self.py, "-m", "torch.distributed.run",  # torchrun
            f"--nnodes={slot.nodes}", f"--nproc-per-node={len(slot.gpus)}", "--rdzv-backend=c10d",
            f"--shutdown-timeout={r.slurm.grace_seconds}",  # time workers get after TERM to checkpoint
            Sh(sh=f"--rdzv-endpoint={head}:${{PORT_TORCH_RDZV}}"), Sh(sh="--rdzv-id=${SLURM_JOB_ID}"),
            "-m", "slurmrl.runtime.trainer", "--config", self.config_path("trainer"),
        )
        if self.preflight:
            argv = self.runtime_argv("probe", "trainer")
        settings = {
            "kind": r.kind, "model": r.model.path, "world_size": world, "global_batch": batch,
            **t.model_dump(exclude={"env", "nodes", "gpus_per_node"}, exclude_none=True),
        }
        if r.kind == "rl" and t.weight_sync == "nccl":
            settings["broadcast"] = {"group": slot.group, "node": slot.first_node, "port": "weight_broadcast"}
            self.warnings.append(
                "trainer.weight_sync = 'nccl': the trainer does not broadcast over NCCL yet; "
                "weights go to the servers through the run dir (filesystem)"
            )
        self.add(
            name="trainer", role="trainer", group=slot.group, slot=slot, first_node=slot.first_node, nodes=slot.nodes,
            tasks_per_node=1, gpus_per_node=len(slot.gpus), stage=4, main=True, checkpoints=True,
            argv=argv, env=dict(t.env), health=None,
            instances=tuple(
                Instance(rank=n, node=n, local=0, gpus=slot.gpus, ports={"rdzv": "torch_rdzv"} if n == 0 else {})
                for n in range(slot.nodes)
            ),
            settings=settings,
        )

    def orchestrator(self) -> None:
        r, o = self.r, self.r.orchestrator
        if o.placement == "own":
            g = self.group("orchestrator", 1, 0)
        elif o.placement == "trainer":
            g = self.groups[self.slots["trainer"].group]
        else:
            g = self.groups[self.comps_by_name(self.server_names()[0])["group"]]
        self.reserve(g, 0, o.cpus, "the orchestrator")
        router = [c for c in self.comps if c["name"] == "router"]
        settings = {
            **o.model_dump(exclude={"env", "placement", "cpus"}),
            "served_model_name": r.model.served_name or r.model.path,
            "model": r.model.path,
            "max_steps": r.trainer.max_steps,
            "requests": [{"group": router[0]["group"], "node": 0, "port": "router"}] if router
            else self.endpoints(self.server_names()),
            "admin": self.endpoints(self.server_names()),
        }
        self.add(
            name="orchestrator", role="orchestrator", group=g.index, first_node=0, nodes=1, tasks_per_node=1,
            cpus_per_task=o.cpus, gpus_per_node=0, stage=4, main=True, checkpoints=True,
            argv=self.runtime_argv("orchestrator", "orchestrator"), env=dict(o.env), health=None,
            instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={"http": "orchestrator"}),),
            settings=settings,
        )

    # ---- assemble -----------------------------------------------------------------------
    def build(self) -> Plan:
        r = self.r
        self.slots = self.layout()
        if r.inference is not None:
            self.inference()
            self.mooncake()
            self.router()
        if r.trainer is not None:
            self.trainer()
        if r.orchestrator is not None:
            self.orchestrator()
        self.split_cpus()
        for c in self.comps:  # one OpenMP thread pool per trainer process, sized to its CPUs
            if c["role"] == "trainer":
                c["env"].setdefault("OMP_NUM_THREADS", str(max(1, c["cpus_per_task"] // len(c["slot"].gpus))))
        for g in self.groups:  # ask Slurm only for the GPUs the plan uses (others may share the node)
            used = [i for c in self.comps if c.get("slot") and c["group"] == g.index for i in c["slot"].gpus]
            if g.gpus_per_node:
                g.gpus_per_node = max(used) + 1 if used else 0
        comps = []
        for c in sorted(self.comps, key=lambda c: c["stage"]):
            slot = c.pop("slot", None)
            shared = slot is not None and slot.shared
            fail_fast = c.pop("fail_fast")
            c["gpus_per_node"] = self.groups[c["group"]].gpus_per_node if shared else c["gpus_per_node"]
            c["overlap"] = shared
            c["settings"] = {**c["settings"], "fail_fast": fail_fast}
            comps.append(Component(**c, srun=self.srun_args(c, fail_fast)))
        used_ports = _ports_used(comps)
        stage_ids = sorted({c.stage for c in comps})
        groups = tuple(
            HetGroup(
                index=g.index, name=g.name, nodes=g.nodes, gpus_per_node=g.gpus_per_node,
                cpus_per_node=self._group_cpus(g), roles=tuple(g.roles),
                directives=group_directives(r, g.index, g.nodes, g.gpus_per_node, self._group_cpus(g), self.run_dir),
            )
            for g in self.groups
        )
        return Plan(
            name=r.name, kind=r.kind, job_name=r.slurm.job_name or r.name, groups=groups, components=tuple(comps),
            stages=tuple(
                Stage(index=i, title=dict(STAGES)[s], components=tuple(c.name for c in comps if c.stage == s))
                for i, s in enumerate(stage_ids)
            ),
            ports={k: ports.offset(k) for k in sorted(used_ports, key=ports.offset)},
            port_base=r.placement.port_base,
            container_flags=container_flags(r, self.run_dir),
            python=self.py, venv=r.python.venv, modules=tuple(r.python.modules), setup=tuple(r.python.setup),
            env=dict(r.env), services=tuple(c.name for c in comps if c.stage in (0, 3)),
            requeue=r.slurm.requeue, signal=r.slurm.signal.split("@")[0], grace_seconds=r.slurm.grace_seconds,
            warnings=tuple(self.warnings),
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
        args.append(f"--kill-on-bad-exit={int(fail_fast)}")
        args.append(Sh(sh=f"--output=${{LOG_DIR}}/{c['name']}.%t.log"))
        return tuple(args)

    def _group_cpus(self, g: _Group) -> int:
        return self.r.slurm.cpus_per_node if g.gpus_per_node else self.r.orchestrator.cpus


def _ports_used(comps) -> set[str]:
    import re

    names: set[str] = set()
    for c in comps:
        if c.role == "trainer":
            names.add("torch_rdzv")
        if c.health:
            names.update(c.health.ports)
        for i in c.instances:
            names.update(i.ports.values())
            for text in (*i.args, *i.env.values()):
                names.update(re.findall(r"\{port:([a-z0-9_]+)\}", text))
        for v in _walk(c.settings):
            if isinstance(v, dict) and "port" in v:
                names.add(v["port"])
    return names


def _walk(x):
    yield x
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


def container_flags(r: Recipe, run_dir: str) -> tuple[str, ...]:
    c = r.container
    if c is None:
        return ()
    flags = [f"--container-image={c.image}", f"--container-mounts={','.join([f'{run_dir}:{run_dir}', *c.mounts])}"]
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

    With ``preflight`` every component runs ``slurmrl.runtime.probe`` in the same layout.
    """
    rules.check(recipe)
    return _Builder(recipe, run_dir, preflight).build()
