"""NVIDIA Dynamo on Slurm (``inference.backend = "dynamo"``), in place of vLLM servers + vllm-router.

On the first inference node (the prefill group's in mode ``pd``): etcd (discovery), NATS when a
request or event plane is ``nats``, and Dynamo's OpenAI frontend (``python -m dynamo.frontend``),
which routes to every worker registered in etcd under the job's own namespace
(``DYN_NAMESPACE=job$SLURM_JOB_ID``, so jobs sharing an etcd never see each other's workers).

Workers, aggregated (mode ``replicas``) or disaggregated (mode ``pd``: prefill and decode in their
own het groups, replicas of each): ``python -m dynamo.vllm`` and ``python -m dynamo.mocker`` run one
task per worker, like vLLM servers (GPU slice and ``DYN_SYSTEM_PORT`` from ``SLURM_LOCALID``), and
``dynamo.vllm`` with ``dp`` > 1 one per data-parallel rank or per node of a worker (``dp``);
``python -m dynamo.trtllm`` runs one MPI rank per GPU (``srun --mpi=pmix`` and
``trtllm-llmapi-launch``), one srun step per worker (a step is one MPI world), and a worker of
``tp`` GPUs may span ``tp / GPUs-per-node`` nodes; every rank sees the worker's GPUs of its node,
as TRT-LLM expects (it picks its device from its local rank).

Readiness is the frontend's: the served model is listed at ``/v1/models`` and every worker is
registered (the frontend's ``/health`` answers 200 with no worker at all, so it is not used).
Stops run in reverse start order: the frontend, then the workers, then NATS and etcd.
"""

from __future__ import annotations

from slurmrl import ports
from slurmrl.contract import job_env
from slurmrl.errors import UserError
from slurmrl.plan import parallel, shell
from slurmrl.plan.context import Context
from slurmrl.plan.engines.base import serves_backend
from slurmrl.plan.engines.dynamo import dp as dynamo_dp
from slurmrl.plan.engines.dynamo import frontend as dynamo_frontend
from slurmrl.plan.engines.dynamo import sglang as dynamo_sglang
from slurmrl.plan.engines.dynamo.dp import Role
from slurmrl.plan.engines.vllm import flags as vllm
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.parallel import Parallelism
from slurmrl.plan.spec import Slot, Spec, Supervisor, restart_of
from slurmrl.recipe.dynamo import Dynamo, DynamoInference
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.user_set import user_set
from slurmrl.rundir.paths import RunDir

name = "dynamo"

SERVICE_CPUS = {"etcd": 1, "nats": 1, "frontend": 2}
SERVICE_NAMES = {"etcd": "etcd", "nats": "NATS"}  # as ctx.reserve names the head services in an error
MODULES = {"vllm": "dynamo.vllm", "trtllm": "dynamo.trtllm", "sglang": dynamo_sglang.MODULE, "mocker": "dynamo.mocker"}
NAMESPACE = Sh(sh="job${SLURM_JOB_ID}")  # one Dynamo namespace per job, the same in every het group
OWN_ENV = ("DYN_NAMESPACE", "ETCD_ENDPOINTS", "NATS_SERVER", "DYN_SYSTEM_PORT", "DYN_REQUEST_PLANE",
           "DYN_EVENT_PLANE")  # set by the plan; a recipe's env may not
NIXL_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
WORKER_ROLE = "dynamo-worker"
FRONTEND_ROLE = "dynamo-frontend"


leftover_check = True  # wide-EP workers leave /dev/shm/moe_* and GPU memory behind when killed


def resolve(r: Recipe) -> Recipe:
    return r


def serves(r: Recipe) -> bool:
    return serves_backend(r, name)


def section(r: Recipe) -> DynamoInference:
    """[inference] of a recipe Dynamo serves."""
    assert isinstance(r.inference, DynamoInference), "planned only for [inference] with backend 'dynamo'"
    return r.inference


def needs_nats(d: Dynamo) -> bool:
    return "nats" in (d.request_plane, d.event_plane)


# ---- what Dynamo cannot honour (a key of another engine is the loader's unknown key) -------------
def check(r: Recipe) -> None:
    """One line naming the field for every combination Dynamo cannot honour."""
    if not serves(r):
        return
    inf = section(r)
    if r.kind != "inference":
        raise UserError("inference.backend", f"Dynamo serves kind 'inference' only (kind is {r.kind!r}): RL reloads "
                        "weights through vLLM's admin endpoints")
    if inf.auth != "none":
        raise UserError("inference.auth", "Dynamo's frontend cannot check the job's secret (it has no API-key option): "
                        "set auth = \"none\" and keep its port off networks you do not trust")
    if inf.gpus_per_node == 0:
        raise UserError("inference.gpus_per_node", "Dynamo workers take tp GPUs each (the mocker too: it stands in "
                        "for a GPU engine); leave it out or give at least tp")
    check_engine_flags(r, inf)
    dynamo_dp.check(inf)
    dynamo_sglang.check(r, inf)
    check_configs(inf)
    check_services(r, inf)


def check_engine_flags(r: Recipe, inf: DynamoInference) -> None:
    """vLLM's flags (and the model's) are read by engine ``vllm``'s workers only."""
    engine = inf.dynamo.engine
    if engine == "vllm":
        return
    own = {"trtllm": "the engine config", "sglang": "inference.dynamo.mem_fraction_static and extra_args"}.get(
        engine, "inference.dynamo.extra_args")
    for role, spec in (("prefill", inf.prefill), ("decode", inf.decode)):
        if spec is not None and user_set(spec, "expert_parallel"):
            raise UserError(f"inference.{role}.expert_parallel", f"engine {engine!r}: set expert parallelism in "
                            "the engine config")
    for field in ("gpu_memory_utilization", "expert_parallel"):
        if user_set(inf, field):
            raise UserError(f"inference.{field}", f"a vLLM flag; engine {engine!r} takes its own in {own}")
    if user_set(inf, "enforce_eager"):
        raise UserError("inference.enforce_eager", f"a vLLM flag; engine {engine!r} does not take it")
    if engine == "sglang":  # SGLang takes the model's dtype and remote code (--dtype, --trust-remote-code)
        return
    if user_set(r.model, "dtype"):
        raise UserError("model.dtype", f"engine {engine!r} takes the dtype from the model (or engine config)")
    if user_set(r.model, "trust_remote_code"):
        raise UserError("model.trust_remote_code", f"a vLLM flag; engine {engine!r} does not take it")


def check_configs(inf: DynamoInference) -> None:
    """Engine ``trtllm`` reads an engine-config YAML per role; no other engine reads one."""
    d = inf.dynamo
    if d.engine != "trtllm":
        for field in ("engine_config", "prefill_engine_config", "decode_engine_config"):
            if getattr(d, field):
                raise UserError(f"inference.dynamo.{field}", "only engine 'trtllm' reads an engine-config YAML")
        return
    configs = {"engine_config": d.engine_config}
    if inf.mode == "pd":
        configs = {"prefill_engine_config": d.prefill_engine_config or d.engine_config,
                   "decode_engine_config": d.decode_engine_config or d.engine_config}
    for field, value in configs.items():
        if not value:
            raise UserError(f"inference.dynamo.{field}", "engine 'trtllm' needs an engine-config YAML "
                            "(--extra-engine-args)")
    if inf.mode == "pd" and d.engine_config and d.prefill_engine_config and d.decode_engine_config:
        raise UserError("inference.dynamo.engine_config", "both roles have their own (prefill_engine_config, "
                        "decode_engine_config)")
    if inf.mode != "pd" and (d.prefill_engine_config or d.decode_engine_config):
        raise UserError("inference.dynamo.prefill_engine_config", "only used with mode 'pd'")


def check_services(r: Recipe, inf: DynamoInference) -> None:
    """The mocker's clock, NATS, and the environment the plan sets for every Dynamo process."""
    d = inf.dynamo
    if d.speedup_ratio is not None and d.engine != "mocker":
        raise UserError("inference.dynamo.speedup_ratio", "only engine 'mocker' simulates time")
    if d.nats_server and not needs_nats(d):
        raise UserError("inference.dynamo.nats_server", "no plane uses NATS: set request_plane or event_plane "
                        "to \"nats\"")
    envs = [("env", r.env), ("inference.env", inf.env), ("inference.dynamo.env", d.env)]
    envs += [(f"inference.{role}.env", spec.env) for role, spec in (("prefill", inf.prefill), ("decode", inf.decode))
             if spec is not None]
    for where, env in envs:
        for key in env:
            if key in OWN_ENV:
                raise UserError(f"{where}.{key}", "is set by the plan for every Dynamo process (see "
                                "inference.dynamo)")
    dynamo_frontend.check(inf, envs)


# ---- where the workers go ----------------------------------------------------------------------
def _worker_span(r: Recipe, p: Parallelism, gpn: int) -> tuple[int, int]:
    """(nodes per worker, its GPUs per node): a tp group spans nodes only with engine 'trtllm' (MPI);
    vllm's data-parallel ranks may (one process per rank); the mocker's stay in its one process."""
    engine = section(r).dynamo.engine
    if engine == "sglang":
        return dynamo_sglang.span(p, gpn)
    span, per = parallel.worker_span(p, gpn, tp_spans=engine == "trtllm", one_node=f"; dynamo.{engine} workers' "
                                     "tensor-parallel groups run on one node (engine 'trtllm' spans nodes with MPI)")
    if span > 1 and p.dp > 1 and engine == "mocker":
        raise UserError(f"{p.field}.dp", f"the mocker simulates a worker's dp ranks in one process on one node: "
                        f"tp x dp = {p.size} GPUs is more than the {gpn} of a node")
    if span > 1 and p.dp > 1 and gpn % p.tp:
        raise UserError(f"{p.field}.tp", f"tp={p.tp} does not divide the {gpn} GPUs per node: a worker of "
                        f"tp x dp = {p.size} GPUs spans nodes, and each data-parallel rank stays on one node")
    return span, per


def _parallelism(inf: DynamoInference, field: str, tp: int, dp: int) -> Parallelism:
    if inf.dynamo.engine == "sglang":
        return dynamo_sglang.parallelism(inf, field, tp, dp)
    return Parallelism(field, tp, dp, by_tp=dp == 1)


def roles(r: Recipe) -> list[Role]:
    inf = section(r)
    d = inf.dynamo
    gpn = r.slurm.gpus_per_node
    out = []
    if inf.mode != "pd":
        n = inf.gpus_per_node or gpn
        p = _parallelism(inf, "inference", inf.tp, inf.dp)
        span, per = _worker_span(r, p, n)
        workers = parallel.per_node(p, n) if span == 1 else 1
        if d.engine == "sglang":
            dynamo_sglang.check_shape(r, inf, p, inf.dp, span, workers)
        parallel.whole_workers(p, inf.nodes, span)
        tasks, task_gpus, ranks = dynamo_dp.tasks(d, p, span, workers, per)
        out.append(Role("inference", None, "inference", inf.nodes // span * workers, inf.tp, inf.dp, span, tasks,
                        task_gpus, inf.nodes, workers * per, (), {}, d.engine_config, bool(inf.expert_parallel),
                        ranks))
    else:
        for name in ("prefill", "decode"):
            spec, field = getattr(inf, name), f"inference.{name}"
            p = _parallelism(inf, field, spec.tp, spec.dp)
            span, per = _worker_span(r, p, gpn)
            nodes, used = parallel.spread(p, spec.replicas, span, per, gpn, spec.nodes)
            if d.engine == "sglang":
                dynamo_sglang.check_shape(r, inf, p, spec.dp, span, spec.replicas // nodes if span == 1 else 1)
            tasks, task_gpus, ranks = dynamo_dp.tasks(d, p, span, spec.replicas // nodes if span == 1 else 1, per)
            config = getattr(d, f"{name}_engine_config") or d.engine_config
            out.append(Role(name, name, field, spec.replicas, spec.tp, spec.dp, span, tasks, task_gpus, nodes, used,
                            tuple(spec.extra_args), dict(spec.env), config, spec.expert_parallel, ranks))
    for role in out:
        if role.per_node > ports.MAX_LOCAL:
            raise UserError(f"{role.field}.tp", f"{role.per_node} {'ranks' if role.rank_tasks else 'workers'} per node; "
                            f"at most {ports.MAX_LOCAL}")
    return out


def place(ctx: Context) -> None:
    """A het group per role (``inference``, or ``prefill`` and ``decode``) and its slot."""
    gpn = ctx.r.slurm.gpus_per_node
    for role in roles(ctx.r):
        g = ctx.group(role.name, role.nodes, gpn)
        ctx.slots[role.name] = Slot(g.index, 0, role.nodes, tuple(range(role.gpus_per_node)))


# ---- components --------------------------------------------------------------------------------
def common_env(ctx: Context, head: int) -> list:
    """What every Dynamo process of the job reads: its namespace, etcd, NATS."""
    d = section(ctx.r).dynamo
    h = shell.head(head).sh
    etcd = d.etcd_endpoints or Sh(sh=f"http://{h}:{shell.var('etcd_client').sh}")
    env: list = [("DYN_NAMESPACE", NAMESPACE), ("ETCD_ENDPOINTS", etcd)]
    if d.nats_server:
        env.append(("NATS_SERVER", d.nats_server))
    elif needs_nats(d):
        env.append(("NATS_SERVER", Sh(sh=f"nats://{h}:{shell.var('nats').sh}")))
    return env + sorted(d.env.items())


def planes(d: Dynamo) -> list[Arg]:
    return ["--request-plane", d.request_plane, "--event-plane", d.event_plane]


def data_dir(service: str) -> Sh:
    """The service's data folder in the run dir, for this attempt (the script exports both variables)."""
    return Sh(sh=str(RunDir(f"${{{job_env.RUN_DIR}}}").dynamo_data_dir(f"${{{job_env.ATTEMPT}}}", service)))


def services(ctx: Context, head: int) -> None:
    """etcd and NATS (stage 0) on the head node, unless the recipe names existing ones."""
    d = section(ctx.r).dynamo
    env = sorted(d.env.items())  # not the workers' ETCD_*: etcd reads ETCD_* as its own flags
    if not d.etcd_endpoints:
        client, peer = shell.var("etcd_client").sh, shell.var("etcd_peer").sh
        head_service(ctx, head, "etcd", "http", {"client": "etcd_client", "peer": "etcd_peer"}, env, (
            "etcd", "--name", "slurmrl", "--data-dir", data_dir("etcd"),
            "--listen-client-urls", Sh(sh=f"http://0.0.0.0:{client}"),
            "--advertise-client-urls", Sh(sh=f"http://${{host}}:{client}"),
            # one member: peers talk over loopback only
            "--listen-peer-urls", Sh(sh=f"http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls", Sh(sh=f"http://127.0.0.1:{peer}"),
            "--initial-cluster", Sh(sh=f"slurmrl=http://127.0.0.1:{peer}"),
        ))
    if needs_nats(d) and not d.nats_server:
        head_service(ctx, head, "nats", "tcp", {"client": "nats", "monitor": "nats_monitor"}, env, (
            "nats-server", "-a", "0.0.0.0", "-p", shell.var("nats"), "-m", shell.var("nats_monitor"),
            "-js", "-sd", data_dir("nats"),
        ))


def head_service(ctx: Context, head: int, name: str, kind: str, ports: dict[str, str], env, command) -> None:
    """One stage-0 service task on the head node: its CPUs reserved there, ready once its client port
    (``ports["client"]``) answers ``kind`` (http: GET /health; tcp: it accepts)."""
    ctx.reserve(ctx.groups[head], 0, SERVICE_CPUS[name], SERVICE_NAMES[name])
    client = ports["client"]
    ctx.add(Spec(
        name=name, role=name, group=head, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=SERVICE_CPUS[name], gpus_per_node=0, stage=0,
        health=Health(kind=kind, ports=(client,), first_node_only=True, timeout=120),
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports=ports),),
        task=ctx.task(
            Supervisor(name, ready=shell.url(kind, shell.var(client))),
            prelude=[*shell.declare("host"), shell.HOST_LINE], env=env, command=command,
        ),
    ))


def engine_args(ctx: Context, role: Role, first_index: int = 0, slot: Slot | None = None) -> list[Arg]:
    """The worker's command-line arguments after ``python -m dynamo.<engine>`` (``slot``: its
    workers', for engine ``sglang``'s multi-node launch)."""
    r, inf = ctx.r, section(ctx.r)
    d = inf.dynamo
    m = r.model
    args: list[Arg]
    if d.engine == "mocker":
        args = mocker_args(ctx, role)
    elif d.engine == "sglang":
        assert slot is not None, "engine 'sglang' is given its workers' slot"
        args = dynamo_sglang.args(ctx, role, slot, first_index)
    elif d.engine == "trtllm":
        assert role.engine_config is not None, "engine 'trtllm' has its engine config (check)"
        args = ["--model-path", m.path, "--served-model-name", m.served_model_name,
                "--extra-engine-args", role.engine_config, "--tensor-parallel-size", str(role.tp),
                "--gpus-per-node", str(role.gpus_per_node if role.span > 1 else role.tp)]
        if m.max_model_len:
            args += ["--max-seq-len", str(m.max_model_len)]
        if d.attention_dp:
            args.append("--enable-attention-dp")
    else:
        args = ["--model", ctx.model_path(), "--served-model-name", m.served_model_name, "--tensor-parallel-size", str(role.tp),
                *vllm.engine_args(m, inf)]
        if role.expert_parallel:
            args.append("--enable-expert-parallel")
        if role.dp_launch:
            args += dynamo_dp.args(role, first_index)
        if role.mode:
            args += ["--kv-transfer-config", shell.json_word(NIXL_CONFIG)]
    if role.mode:
        args += ["--disaggregation-mode", role.mode]
    return args + planes(d) + list(d.extra_args) + list(role.extra_args)


def mocker_args(ctx: Context, role: Role) -> list[Arg]:
    d, m = section(ctx.r).dynamo, ctx.r.model
    args: list[Arg] = ["--model-path", m.path, "--model-name", m.served_model_name]
    if d.speedup_ratio is not None:
        args += ["--speedup-ratio", f"{d.speedup_ratio:g}"]
    if m.max_model_len:
        args += ["--max-model-len", str(m.max_model_len)]
    if role.dp > 1:  # one process simulates every rank
        args += ["--data-parallel-size", str(role.dp)]
    return args


def worker_env(ctx: Context, role: Role, head: int) -> list:
    return common_env(ctx, head) + sorted({**section(ctx.r).env, **role.env}.items())


def workers(ctx: Context, role: Role, slot: Slot, head: int, first_index: int = 0) -> None:
    """mocker and vllm: one task per worker (per data-parallel rank: vllm with dp > 1), every worker of
    the role in one srun step."""
    d = section(ctx.r).dynamo
    # per-task values straight in the environment (a preflight runs the probe with the same env, no prelude)
    env = worker_env(ctx, role, head) + [("DYN_SYSTEM_PORT", Sh(sh=shell.per_task("server", first_index)))]
    if d.engine == "vllm" and "VLLM_PORT" not in dict(env):
        env.append(vllm.internal_ports(first_index))
    nixl = d.engine == "vllm" and role.mode is not None
    if nixl:  # one side-channel port per worker, indexed by its first GPU: TP ranks add to it, and vLLM
        # adds the data-parallel rank: a rank's base is less its rank, so it listens on its first GPU's port
        less = dynamo_dp.rank(role) if role.dp_launch else ""
        env += [("VLLM_NIXL_SIDE_CHANNEL_HOST", Sh(sh="$(hostname)")),
                ("VLLM_NIXL_SIDE_CHANNEL_PORT", Sh(sh=shell.per_task("nixl", slot.gpus[0], role.task_gpus, less=less)))]
    instances: list[Instance] = []
    for node, local, gpus in role.slice.tasks(slot.gpus, slot.nodes):
        iports = {"system": f"server_{first_index + local}"}
        if nixl:  # each of the task's ranks listens on its own
            iports.update({f"kv{k or ''}": f"nixl_{gpus[0] + k}" for k in range(role.dp_local)})
        iports.update(dynamo_dp.rank_ports(role, node, local, first_index))
        if d.engine == "sglang":
            iports.update(dynamo_sglang.ports(section(ctx.r), role, node, local, first_index))
        instances.append(Instance(rank=len(instances), node=node, local=local, gpus=gpus, ports=iports))
    # a data-parallel rank that dies stalls its worker's other ranks: end the step; a task that is a whole
    # worker is restarted in place
    whole = not (role.rank_tasks or ((role.node_tasks or d.engine == "sglang") and role.span > 1))
    ctx.add(Spec(
        name=role.name, role=WORKER_ROLE, group=slot.group, slot=slot, first_node=slot.first_node, nodes=slot.nodes,
        tasks_per_node=role.per_node, gpus_per_node=len(slot.gpus), stage=2, main=ctx.serving_is_main,
        fail_fast=not whole, health=None,
        instances=tuple(instances), reads_model=d.engine in ("vllm", "sglang"),
        task=ctx.task(
            Supervisor(role.name, gpus=shell.gpu_slice(slot.gpus[0], role.task_gpus, True), ready="started",
                       fail_on=fail_on(ctx), **(restart_of(section(ctx.r)) if whole else {})),
            prelude=dynamo_sglang.prelude(ctx, role, slot) if d.engine == "sglang" else dynamo_dp.prelude(role, slot),
            env=env, command=(*ctx.py, "-m", MODULES[d.engine], *engine_args(ctx, role, first_index, slot)),
        ),
    ))


def fail_on(ctx: Context) -> tuple[str, ...]:
    """The workers' failure probes: [inference]'s."""
    return tuple(ctx.r.inference.fail_on) if ctx.r.inference else ()


def mpi_workers(ctx: Context, role: Role, slot: Slot, head: int) -> None:
    """trtllm: one srun step per worker (one MPI world), one rank per GPU; rank 0 serves Dynamo."""
    count = role.replicas
    for w in range(count):
        name = role.name if count == 1 else f"{role.name}-{w}"
        node, local = role.slice.worker_at(w)
        gpus = role.slice.task_gpus(slot.gpus, local)  # every rank of the node sees them (its local rank picks one)
        ranks_per_node = len(gpus)
        wslot = Slot(slot.group, node, role.span, gpus, shared=role.per_node > 1)
        system = f"server_{local}"
        instances = tuple(
            Instance(rank=n * ranks_per_node + k, node=n, local=k, gpus=gpus,
                     ports={"system": system} if n == 0 and k == 0 else {})
            for n in range(role.span) for k in range(ranks_per_node)
        )
        env = worker_env(ctx, role, head) + [("DYN_SYSTEM_PORT", shell.var(system))]  # rank 0 binds it
        ctx.add(Spec(
            name=name, role=WORKER_ROLE, group=slot.group, slot=wslot, first_node=node, nodes=role.span,
            tasks_per_node=ranks_per_node, gpus_per_node=len(gpus), stage=2, main=ctx.serving_is_main,
            fail_fast=True, mpi="pmix", health=None, instances=instances,
            task=ctx.task(
                Supervisor(name, gpus=shell.gpu_slice(gpus[0], len(gpus), False), ready="started",
                           fail_on=fail_on(ctx)),
                env=env,
                command=(*shell.tool(ctx.py, "trtllm-llmapi-launch"), *ctx.py, "-m", MODULES["trtllm"],
                         *engine_args(ctx, role)),
            ),
        ))


def frontend(ctx: Context, head: int, workers_total: int) -> None:
    """Dynamo's OpenAI frontend on the head node; ready once the model is listed with every worker."""
    d, m = section(ctx.r).dynamo, ctx.r.model
    ctx.reserve(ctx.groups[head], 0, SERVICE_CPUS["frontend"], "Dynamo's frontend")
    port = shell.var("dynamo_frontend")
    args: list[Arg] = ["--http-host", "0.0.0.0", "--http-port", port, *planes(d), *dynamo_frontend.args(d)]
    # ready means serving: the model listed with every worker, and one completion through the frontend
    sup = Supervisor("frontend", ready=shell.url("http", port), ready_model=m.served_model_name,
                     ready_instances=workers_total, ready_completion=m.served_model_name, **restart_of(section(ctx.r)))
    ctx.add(Spec(
        name="frontend", role=FRONTEND_ROLE, group=head, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=SERVICE_CPUS["frontend"], gpus_per_node=0, stage=3,
        health=Health(kind="http", ports=("dynamo_frontend",), path="/v1/models", first_node_only=True,
                      timeout=section(ctx.r).startup_timeout, urls_var="URLS_FRONTEND"),
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={"http": "dynamo_frontend"}),),
        task=ctx.task(
            sup, prelude=[*shell.declare("host"), shell.HOST_LINE], env=common_env(ctx, head),
            command=(*ctx.py, "-m", "dynamo.frontend", *args, *d.frontend_args),
        ),
    ))


def build(ctx: Context) -> None:
    """Every Dynamo component, after ``place``: services, workers, the frontend (in place of
    vLLM's servers and router)."""
    d = section(ctx.r).dynamo
    all_roles = roles(ctx.r)
    head = ctx.slots[all_roles[0].name].group
    services(ctx, head)
    if d.engine == "sglang" and ctx.r.inference is not None and ctx.r.inference.mode == "pd":
        dynamo_sglang.untried(ctx)
    for role in all_roles:
        slot = ctx.slots[role.name]
        if d.engine == "trtllm":
            mpi_workers(ctx, role, slot, head)
        else:
            workers(ctx, role, slot, head)
    frontend(ctx, head, sum(r.instances for r in all_roles))
