"""Planner tests, one deployment shape at a time: recipe -> plan -> job.sbatch, and what every task
of every component really execs.

The script is the truth: each component's command line stands once in job.sbatch as a task
function, and what differs per task (port, GPU slice, NIXL port, data-parallel rank, headless) is
shell arithmetic on SLURM_NODEID / SLURM_LOCALID and the port table. So the shapes are checked on
what each task would exec: ``tests/task_expand.py`` runs the script's prologue and the task
function in real bash with the programs replaced by a recorder, for every instance (node, local).
The URLs a stage hands on (URLS_INFERENCE, URLS_PREFILL, ...) are the ready URLs the servers'
supervisors were given, in task order, as the batch shell reads them from their ready files.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import re
import shutil
import tempfile
from functools import cache
from pathlib import Path

import pytest
from pydantic import ValidationError
from task_expand import JOB_ID, PROGRAMS, RECORDER, Expanded, expand, task_functions

from slurmrl import ports
from slurmrl.app.build import Rendered, build
from slurmrl.plan import plan
from slurmrl.plan.model import Component, Instance, Plan
from slurmrl.recipe.load import read_toml, validate
from slurmrl.rundir import tomlw

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "slurmrl" / "recipes").glob("*.toml"))

# One scratch folder for the module: the run dir (the script makes its secret there, so it must
# exist), recipe files written from dicts, a stand-in venv, and recorders for what expand does not
# record itself (`uv`: rl-1node runs everything through `uv run`).
SCRATCH = Path(tempfile.mkdtemp(prefix="slurmrl-shapes-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
RUN = str(SCRATCH / "run")
Path(RUN).mkdir()
VENV = SCRATCH / "venv"  # gallery recipes name a venv of their cluster; the prologue sources it
(VENV / "bin").mkdir(parents=True)
(VENV / "bin" / "activate").write_text("")
BIN = SCRATCH / "bin"
BIN.mkdir()
for _prog in (*PROGRAMS, "uv"):
    (BIN / _prog).write_text(RECORDER)
    (BIN / _prog).chmod(0o755)


# ---- recipes -----------------------------------------------------------------------------------


def make(kind: str, gpus: int = 8, cpus: int = 64, **sections) -> dict:
    d = {"name": "x", "kind": kind, "slurm": {"gpus_per_node": gpus, "cpus_per_node": cpus}, "model": {"path": "m"}}
    if kind == "sft":
        d["trainer"] = {"dataset": "/d.jsonl", "batch_size": 64, "micro_batch_size": 1}
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return d


def rl(gpus: int = 8, cpus: int = 64, **sections) -> dict:
    base = {
        "inference": {},
        "trainer": {"micro_batch_size": 1},
        "orchestrator": {"prompts_per_step": 8, "rollouts_per_prompt": 8},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return make("rl", gpus, cpus, **base)


def P(d: dict) -> Plan:
    return plan(validate(d), RUN)


# ---- rendered jobs and their tasks -------------------------------------------------------------


class Job:
    """A rendered recipe, and what each task of each component execs."""

    def __init__(self, out: Rendered):
        self.out = out
        self.plan = out.plan
        self.script = out.script
        self._tasks: dict[str, list[tuple[Instance, Expanded]]] = {}
        self._urls: dict[str, str] | None = None

    def _run(self, name: str, node: int, local: int, urls: dict[str, str], env: dict | None = None) -> Expanded:
        return expand(self.script, self.plan, name, node, local,
                      env={"PATH": f"{BIN}:{os.environ['PATH']}", **urls, **(env or {})})

    @property
    def urls(self) -> dict[str, str]:
        """URLS_<NAME> the batch shell exports after each stage: every task's ready URL in task order
        (a task without one, e.g. a headless wide-EP node, writes '-' and is left out)."""
        if self._urls is None:
            urls: dict[str, str] = {}
            for c in self.plan.components:  # in stage order
                if c.health and c.health.urls_var:
                    found = [ready_url(self._run(c.name, i.node, i.local, urls)) for i in c.instances]
                    urls[c.health.urls_var] = " ".join(u for u in found if u)
            self._urls = urls
        return self._urls

    def run(self, name: str, node: int = 0, local: int = 0, env: dict | None = None) -> Expanded:
        return self._run(name, node, local, self.urls, env)

    def tasks(self, name: str) -> list[tuple[Instance, Expanded]]:
        """(instance, what it execs) for every task of a component."""
        if name not in self._tasks:
            c = self.plan.component(name)
            self._tasks[name] = [(i, self.run(name, i.node, i.local)) for i in c.instances]
        return self._tasks[name]

    def host(self, c: Component, inst: Instance) -> str:
        """The hostname expand gives the task (node names g<group>n<index>)."""
        return f"g{c.group}n{c.first_node + inst.node}"


def _with_local_venv(d: dict) -> dict:
    if d.get("python", {}).get("venv"):
        d = copy.deepcopy(d)
        d["python"]["venv"] = str(VENV)
    return d


@cache
def _build_text(text: str) -> Job:
    path = SCRATCH / "recipes" / f"r{abs(hash(text))}.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return Job(build(path, run_dir=RUN))


def B(d: dict) -> Job:
    """Render a recipe dict (written to a file, as a user would) into a job."""
    return _build_text(tomlw.dumps(_with_local_venv(d)))


def base(p: Plan) -> int:
    """PORT_BASE in expand's batch environment (the first block is granted)."""
    return p.port_base or ports.base_for_job(JOB_ID)


def port(p: Plan, name: str) -> int:
    return base(p) + p.ports[name]


def ready_url(e: Expanded) -> str | None:
    """The URL the task's supervisor writes to its ready file (None: '-')."""
    sup = e.supervisor
    if "--ready" not in sup:
        return None
    url = sup[sup.index("--ready") + 1]
    return None if url == "started" else url


def gpus_of(e: Expanded) -> tuple[int, ...]:
    """GPU positions the supervisor narrows the task to (``--gpus FIRST:COUNT``)."""
    sup = e.supervisor
    if "--gpus" not in sup:
        return ()
    first, count = (int(x) for x in sup[sup.index("--gpus") + 1].split(":"))
    return tuple(range(first, first + count))


def values_after(args: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next ``--option``."""
    assert flag in args, f"{flag} not in {args}"
    out = []
    for a in args[args.index(flag) + 1:]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def pools(args: list[str], flag: str) -> list[str]:
    """vllm-router's repeated ``--prefill URL`` / ``--decode URL``."""
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def kv_cfg(e: Expanded) -> dict:
    return json.loads(e.after("--kv-transfer-config"))


def prefixed(args: list[str], prefix: str) -> str:
    found = [a[len(prefix):] for a in args if a.startswith(prefix)]
    assert len(found) == 1, (prefix, args)
    return found[0]


def listens(job: Job, c: Component, inst: Instance, e: Expanded) -> dict[str, int]:
    """The ports a task listens on, by purpose, read off what it execs."""
    cmd = e.command
    if c.role in ("inference", "judge"):  # vLLM servers (the judge's too)
        headless = "--headless" in cmd  # a multi-node worker's follower: no API, no DP coordinator
        out = {} if headless else {"http": int(e.after("--port"))}
        if "--data-parallel-rpc-port" in cmd and not headless:
            out["dp_rpc"] = int(e.after("--data-parallel-rpc-port"))
        if "VLLM_NIXL_SIDE_CHANNEL_PORT" in e.env:  # one side channel per engine: base + its DP rank
            ranks = int(e.after("--data-parallel-size-local")) if "--data-parallel-size-local" in cmd else (
                int(e.after("--data-parallel-size")) if "--data-parallel-size" in cmd else 1)
            first = int(e.after("--data-parallel-start-rank")) if headless else 0
            for k in range(ranks):
                out[f"kv{k or ''}"] = int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + first + k
        elif "VLLM_MOONCAKE_BOOTSTRAP_PORT" in e.env and not headless:  # a prefill worker's first engine
            out["kv"] = int(e.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"])
        return out
    if c.role == "router":
        out = {"http": int(e.after("--port")), "metrics": int(e.after("--prometheus-port"))}
        if "--listen" in cmd:  # the secret's gate listens on the job's router port, vllm-router behind it
            out = {**out, "upstream": out["http"], "http": int(e.after("--listen").rpartition(":")[2])}
        return out
    if c.name == "mooncake-master":
        return {"rpc": int(prefixed(cmd, "-rpc_port=")), "metadata": int(prefixed(cmd, "-http_metadata_server_port=")),
                "admin": int(prefixed(cmd, "-metrics_port="))}
    if c.name.startswith("mooncake-client"):
        return {"client": int(prefixed(cmd, "--port="))}
    if c.role == "dynamo-worker":  # Dynamo's system port; an MPI worker's rank 0 alone binds it
        if c.mpi and inst.rank:
            return {}
        out = {"system": int(e.env["DYN_SYSTEM_PORT"])}
        if "VLLM_NIXL_SIDE_CHANNEL_PORT" in e.env:
            out["kv"] = int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        return out
    if c.role == "dynamo-frontend":
        return {"http": int(e.after("--http-port"))}
    if c.role == "etcd":
        return {"client": int(e.after("--listen-client-urls").rpartition(":")[2]),
                "peer": int(e.after("--listen-peer-urls").rpartition(":")[2])}
    if c.role == "nats":
        return {"client": int(e.after("-p")), "monitor": int(e.after("-m"))}
    if c.role == "trainer":  # the c10d store runs where the endpoint's host is this task's host
        host, _, p = prefixed(cmd, "--rdzv-endpoint=").rpartition(":")
        out = {"rdzv": int(p)} if host == job.host(c, inst) else {}
        if "--weight-master" in cmd:  # the weight-transfer group: hosted by torchrun's rank 0, on its own node
            host, _, p = e.after("--weight-master").rpartition(":")
            out.update({"weights": int(p)} if host == job.host(c, inst) else {})
        return out
    return {}


def srun_strs(c) -> list[str]:
    return [a if isinstance(a, str) else a.sh for a in c.srun]


def assert_tasks_match_instances(job: Job, name: str) -> None:
    """What each task execs agrees with the plan's instance: GPU slice and the ports it listens on."""
    c, p = job.plan.component(name), job.plan
    for inst, e in job.tasks(name):
        assert gpus_of(e) == inst.gpus, (name, inst, e.supervisor)
        assert listens(job, c, inst, e) == {k: port(p, n) for k, n in inst.ports.items()}, (name, inst)


# ---- SFT ---------------------------------------------------------------------------------------


def test_sft_one_node_torchrun_uses_every_gpu():
    job = B(make("sft"))
    p = job.plan
    assert len(p.groups) == 1 and p.groups[0].nodes == 1
    t = p.component("trainer")
    e = job.run("trainer")
    assert e.supervisor[:4] == ["python3", "-m", "slurmrl.runtime.steps.supervise", "trainer"]
    assert e.command[0] == "torchrun"
    assert "--nnodes=1" in e.command
    assert "--nproc-per-node=8" in e.command
    assert f"--rdzv-endpoint=g0n0:{port(p, 'torch_rdzv')}" in e.command
    assert f"--rdzv-id={JOB_ID}" in e.command
    assert t.tasks_per_node == 1 and t.gpus_per_node == 8
    assert [i.gpus for i in t.instances] == [tuple(range(8))] and gpus_of(e) == tuple(range(8))
    assert "torch_rdzv" in p.ports
    # the trainer is what the job waits for; on TERM its workers get the grace period to checkpoint
    assert t.main and f"--shutdown-timeout={p.grace_seconds}" in e.command
    assert e.command[-2:] == ["--config", f"{RUN}/components/trainer.toml"]
    assert "checkpoint_every" in t.settings and "components/trainer.toml" in job.out.files


def test_sft_multinode_nnodes_and_one_agent_per_node():
    job = B(make("sft", trainer={"nodes": 4, "batch_size": 64, "micro_batch_size": 2}))
    p = job.plan
    t = p.component("trainer")
    assert t.nodes == 4 and len(t.instances) == 4
    assert sorted(i.node for i in t.instances) == [0, 1, 2, 3]
    assert "--ntasks=4" in srun_strs(t) and "--nodes=4" in srun_strs(t)
    assert t.settings["world_size"] == 32
    endpoints = set()
    for inst, e in job.tasks("trainer"):
        assert "--nnodes=4" in e.command and "--nproc-per-node=8" in e.command, inst
        assert gpus_of(e) == tuple(range(8))
        endpoints.add((prefixed(e.command, "--rdzv-endpoint="), prefixed(e.command, "--rdzv-id=")))
    assert endpoints == {(f"g0n0:{port(p, 'torch_rdzv')}", str(JOB_ID))}  # every agent meets at node 0
    # only node 0 hosts the rendezvous
    assert [bool(i.ports) for i in t.instances] == [True, False, False, False]
    assert [bool(listens(job, t, i, e)) for i, e in job.tasks("trainer")] == [True, False, False, False]
    g = p.groups[0]
    assert g.nodes == 4 and ("--nodes", "4") in [(d.option, d.value) for d in g.directives]


def test_sft_trainer_gpus_per_node_limits_nproc():
    job = B(make("sft", trainer={"gpus_per_node": 4, "batch_size": 64, "micro_batch_size": 1}))
    e = job.run("trainer")
    assert "--nproc-per-node=4" in e.command
    assert gpus_of(e) == (0, 1, 2, 3)


# ---- RL colocated ------------------------------------------------------------------------------


def test_rl_colocated_six_plus_two():
    job = B(rl(placement={"colocate": True}, inference={"gpus_per_node": 6}, trainer={"gpus_per_node": 2}))
    p = job.plan
    assert len(p.groups) == 1
    inf, tr = p.component("inference"), p.component("trainer")
    assert [i.gpus for i in inf.instances] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert [gpus_of(e) for _, e in job.tasks("inference")] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert len({e.after("--port") for _, e in job.tasks("inference")}) == 6
    assert [i.gpus for i in tr.instances] == [(6, 7)]
    assert [gpus_of(e) for _, e in job.tasks("trainer")] == [(6, 7)]
    for c in (inf, tr):
        assert c.overlap, c.name
        assert c.gpus_per_node == 8, c.name
        assert "--overlap" in srun_strs(c)
        assert "--gpus-per-node=8" in srun_strs(c)
        assert_tasks_match_instances(job, c.name)
    assert "--nproc-per-node=2" in job.run("trainer").command
    # no GPU owned twice, by what the tasks take
    owned = [g for n in ("inference", "trainer") for _, e in job.tasks(n) for g in gpus_of(e)]
    assert len(owned) == len(set(owned)) == 8


def test_rl_colocated_trainer_defaults_to_leftover_gpus():
    job = B(rl(placement={"colocate": True}, inference={"gpus_per_node": 4}))
    assert job.plan.component("trainer").instances[0].gpus == (4, 5, 6, 7)
    e = job.run("trainer")
    assert gpus_of(e) == (4, 5, 6, 7) and "--nproc-per-node=4" in e.command


def test_rl_single_shared_gpu():
    job = B(rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True}))
    p = job.plan
    inf, tr = p.component("inference"), p.component("trainer")
    assert [i.gpus for i in inf.instances] == [(0,)]
    assert [i.gpus for i in tr.instances] == [(0,)]
    assert gpus_of(job.run("inference")) == gpus_of(job.run("trainer")) == (0,)
    assert inf.overlap and tr.overlap
    assert job.run("inference").after("--gpu-memory-utilization") == "0.45"
    assert p.warnings and any("gpu_memory_utilization" in w for w in p.warnings)


def test_rl_single_shared_gpu_keeps_explicit_memory_fraction():
    job = B(rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True},
               inference={"gpu_memory_utilization": 0.3}))
    assert job.run("inference").after("--gpu-memory-utilization") == "0.3"
    assert not any("gpu_memory_utilization" in w for w in job.plan.warnings)


def test_rl_not_shared_has_no_memory_fraction():
    job = B(rl(placement={"colocate": True}, inference={"gpus_per_node": 4}))
    for _, e in job.tasks("inference"):
        assert "--gpu-memory-utilization" not in e.command
    assert job.plan.warnings == ()


# ---- RL multi-node: orchestrator placement ---------------------------------------------------


def _rl_multi_data(placement: str) -> dict:
    own = {"cpu_partition": "cpu"} if placement == "own" else {}  # refused where there is no CPU-only group
    return rl(cpus=32, trainer={"nodes": 2, "micro_batch_size": 1},
              orchestrator={"placement": placement, "prompts_per_step": 16, "rollouts_per_prompt": 8},
              inference={"nodes": 2, "tp": 2},
              slurm={"gpus_per_node": 8, "cpus_per_node": 32, "partition": "gpu", **own})


def _rl_multi(placement: str) -> Plan:
    return P(_rl_multi_data(placement))


def test_rl_multinode_orchestrator_on_trainer():
    p = _rl_multi("trainer")
    assert [g.name for g in p.groups] == ["trainer", "inference"]
    o, t = p.component("orchestrator"), p.component("trainer")
    assert o.group == t.group == 0 and o.first_node == 0
    assert o.gpus_per_node == 0 and "--gpus-per-node=0" in srun_strs(o)
    assert "--het-group=0" in srun_strs(o)


def test_rl_multinode_orchestrator_on_inference():
    p = _rl_multi("inference")
    o, inf = p.component("orchestrator"), p.component("inference")
    assert o.group == inf.group == 1 and o.first_node == 0
    assert "--het-group=1" in srun_strs(o)


def test_rl_multinode_orchestrator_own_cpu_group():
    p = _rl_multi("own")
    assert len(p.groups) == 3
    g = p.groups[2]
    assert g.name == "orchestrator" and g.gpus_per_node == 0 and g.nodes == 1
    o = p.component("orchestrator")
    assert o.group == 2
    s = srun_strs(o)
    assert "--het-group=2" in s
    assert not any(x.startswith("--gpus") for x in s)  # the group has no GPUs to ask about
    opts = {d.option: d.value for d in g.directives}
    assert "--gpus-per-node" not in opts and "--gres" not in opts
    assert opts["--partition"] == "cpu"
    assert opts["--cpus-per-task"] == str(g.cpus_per_node)
    # GPU groups keep the GPU partition
    assert {d.option: d.value for d in p.groups[1].directives}["--partition"] == "gpu"
    # every srun of a het job names its group
    for c in p.components:
        assert f"--het-group={c.group}" in srun_strs(c), c.name


@pytest.mark.parametrize("placement", ["trainer", "inference", "own"])
def test_rl_multinode_orchestrator_reaches_router_and_every_server(placement):
    """Wherever it runs, the orchestrator sends requests to the router and admin calls to every server;
    the trainer's agents meet on the trainer group's first node."""
    job = B(_rl_multi_data(placement))
    p = job.plan
    servers = [f"http://g1n{i.node}:{port(p, i.ports['http'])}" for i in p.component("inference").instances]
    assert len(servers) == 8
    e = job.run("orchestrator")
    assert values_after(e.command, "--requests-url") == [f"http://g1n0:{port(p, 'router')}"]
    assert values_after(e.command, "--admin-urls") == servers
    assert values_after(job.run("router").command, "--worker-urls") == servers
    for _, t in job.tasks("trainer"):
        assert prefixed(t.command, "--rdzv-endpoint=") == f"g0n0:{port(p, 'torch_rdzv')}"


# ---- inference replicas ------------------------------------------------------------------------


@pytest.mark.parametrize("tp,dp,per_node", [(1, 1, 8), (2, 1, 4), (2, 2, 2), (4, 1, 2), (8, 1, 1), (1, 4, 2)])
def test_replicas_servers_per_node(tp, dp, per_node):
    job = B(make("inference", inference={"nodes": 2, "tp": tp, "dp": dp}))
    p = job.plan
    inf = p.component("inference")
    assert inf.tasks_per_node == per_node
    assert len(inf.instances) == 2 * per_node
    for node in (0, 1):
        on_node = [(i, e) for i, e in job.tasks("inference") if i.node == node]
        assert len(on_node) == per_node
        assert len({e.after("--port") for _, e in on_node}) == per_node
        gpus = [g for _, e in on_node for g in gpus_of(e)]
        assert sorted(gpus) == list(range(8))
        for i, e in on_node:
            assert len(i.gpus) == tp * dp and gpus_of(e) == i.gpus
            assert e.after("--tensor-parallel-size") == str(tp)
            if dp > 1:
                assert e.after("--data-parallel-size") == str(dp)
            else:
                assert "--data-parallel-size" not in e.command
        if dp > 1:
            assert len({e.after("--data-parallel-rpc-port") for _, e in on_node}) == per_node
    assert_tasks_match_instances(job, "inference")
    names = [c.name for c in p.components]
    assert ("router" in names) == (2 * per_node > 1)


def test_replicas_one_server_has_no_router():
    p = P(make("inference", inference={"tp": 8}))
    assert [c.name for c in p.components] == ["inference"]
    assert "router" not in p.ports


def test_replicas_router_enabled_explicitly_for_one_server():
    job = B(make("inference", inference={"tp": 8, "router": {"enabled": True}}))
    p = job.plan
    assert values_after(job.run("router").command, "--worker-urls") == [f"http://g0n0:{port(p, 'server_0')}"]
    assert "router" in p.services


def test_replicas_router_disabled_explicitly():
    p = P(make("inference", inference={"nodes": 2, "router": {"enabled": False}}))
    assert "router" not in [c.name for c in p.components]


def test_replicas_router_lists_every_server():
    job = B(make("inference", inference={"nodes": 3, "tp": 2}))
    inf = job.plan.component("inference")
    workers = values_after(job.run("router").command, "--worker-urls")
    assert len(workers) == 12 and len(set(workers)) == 12
    # each server's own address: its node's host and the --port it was started with
    assert workers == [f"http://{job.host(inf, i)}:{e.after('--port')}" for i, e in job.tasks("inference")]
    assert {w.rsplit(":", 1)[0] for w in workers} == {"http://g0n0", "http://g0n1", "http://g0n2"}
    assert job.urls["URLS_INFERENCE"].split() == workers
    assert_tasks_match_instances(job, "router")


# ---- wide-EP -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dp", [32, 1])
def test_wide_ep_one_task_per_node_headless_followers(dp):
    job = B(make("inference", cpus=96, inference={"mode": "wide_ep", "nodes": 4, "tp": 1, "dp": dp}))
    p = job.plan
    inf = p.component("inference")
    assert inf.tasks_per_node == 1 and len(inf.instances) == 4
    g = inf.group
    for i, e in job.tasks("inference"):
        a = e.command
        assert i.gpus == tuple(range(8)) and gpus_of(e) == i.gpus
        assert e.after("--data-parallel-size") == "32"
        assert e.after("--data-parallel-size-local") == "8"
        assert e.after("--data-parallel-address") == f"g{g}n0"  # the head node, on every node
        assert e.after("--data-parallel-rpc-port") == str(port(p, "dprpc_0"))
        assert "--enable-expert-parallel" in a
        if i.node == 0:
            assert "--headless" not in a
            assert "--data-parallel-start-rank" not in a
            assert ready_url(e) == f"http://g{g}n0:{e.after('--port')}"
        else:
            assert "--headless" in a
            assert e.after("--data-parallel-start-rank") == str(i.node * 8)
            assert ready_url(e) is None  # headless: serves no API, writes no URL
    assert inf.health.first_node_only
    # the router is given only the API the head node serves
    assert values_after(job.run("router").command, "--worker-urls") == [f"http://g{g}n0:{port(p, 'server_0')}"]


def test_wide_ep_with_tp2():
    job = B(make("inference", cpus=96, inference={"mode": "wide_ep", "nodes": 2, "tp": 2}))
    (i0, e0), (i1, e1) = job.tasks("inference")
    assert e1.after("--data-parallel-start-rank") == "4"
    assert e0.after("--data-parallel-size") == e1.after("--data-parallel-size") == "8"
    assert e0.after("--data-parallel-size-local") == "4" and e0.after("--tensor-parallel-size") == "2"
    assert gpus_of(e0) == gpus_of(e1) == tuple(range(8))


# ---- P/D ---------------------------------------------------------------------------------------


def _pd(connector: str) -> Job:
    return B(make("inference", inference={
        "mode": "pd", "kv_connector": connector,
        "prefill": {"replicas": 4, "tp": 2}, "decode": {"replicas": 4, "tp": 4, "nodes": 2},
    }))


def test_pd_nixl_separate_groups_and_router_lists():
    job = _pd("NixlConnector")
    p = job.plan
    assert [g.name for g in p.groups] == ["prefill", "decode"]
    pre, dec = p.component("prefill"), p.component("decode")
    assert pre.group != dec.group
    for c in (pre, dec):
        for i, e in job.tasks(c.name):
            cfg = kv_cfg(e)
            assert cfg["kv_connector"] == "NixlConnector"
            assert cfg["kv_role"] == "kv_both"
            # NIXL's side channel: one port per first GPU position, on the task's own host
            assert e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(port(p, f"nixl_{i.gpus[0]}"))
            assert e.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == job.host(c, i)
        assert_tasks_match_instances(job, c.name)
    r = job.run("router").command
    assert "--vllm-pd-disaggregation" in r
    assert r[r.index("--kv-connector") + 1] == "nixl"
    prefill, decode = pools(r, "--prefill"), pools(r, "--decode")
    assert prefill == [f"http://{job.host(pre, i)}:{e.after('--port')}" for i, e in job.tasks("prefill")]
    assert decode == [f"http://{job.host(dec, i)}:{e.after('--port')}" for i, e in job.tasks("decode")]
    assert len(prefill) == 4 and {u.split(":")[1] for u in prefill} == {f"//g{pre.group}n0"}
    assert len(decode) == 4 and {u.split(":")[1] for u in decode} == {f"//g{dec.group}n0", f"//g{dec.group}n1"}
    assert "--worker-urls" not in r


def test_pd_mooncake_producer_consumer_and_bootstrap_ports():
    job = _pd("MooncakeConnector")
    p = job.plan
    pre, dec = p.component("prefill"), p.component("decode")
    for c, role in ((pre, "kv_producer"), (dec, "kv_consumer")):
        for i, e in job.tasks(c.name):
            cfg = kv_cfg(e)
            assert cfg == {"kv_connector": "MooncakeConnector", "kv_role": role,
                           "kv_connector_extra_config": {"mooncake_protocol": "rdma"}}
            if c is pre:
                assert e.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == str(port(p, f"kv_{i.local}"))
            else:
                assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in e.env
            assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in e.env
        assert_tasks_match_instances(job, c.name)
    cmd = job.run("router").command
    assert cmd[cmd.index("--kv-connector") + 1] == "mooncake"
    # each --prefill URL is followed by that server's bootstrap port
    pairs = [(cmd[k + 1], cmd[k + 2]) for k, a in enumerate(cmd) if a == "--prefill"]
    want = [(f"http://{job.host(pre, i)}:{e.after('--port')}", e.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"])
            for i, e in job.tasks("prefill")]
    assert pairs == want and len(pools(cmd, "--decode")) == 4


# ---- KV offload --------------------------------------------------------------------------------


def test_kv_offload_cpu_splits_budget_per_server():
    job = B(make("inference", inference={"tp": 2, "kv_offload": {"kind": "cpu", "cpu_gb": 64}}))
    tasks = job.tasks("inference")
    assert len(tasks) == 4
    for _, e in tasks:
        assert e.after("--kv-offloading-backend") == "native"
        assert float(e.after("--kv-offloading-size")) == 16


def test_kv_offload_cpu_disk_connector():
    job = B(make("inference", inference={"nodes": 2, "tp": 4, "kv_offload": {
        "kind": "cpu_disk", "cpu_gb": 64, "disk_path": "/nvme/kv", "disk_gb": 500}}))
    tasks = job.tasks("inference")
    assert len(tasks) == 4
    for _, e in tasks:
        cfg = kv_cfg(e)
        assert cfg["kv_connector"] == "OffloadingConnector"
        extra = cfg["kv_connector_extra_config"]
        assert extra["disk_path"] == "/nvme/kv"
        assert extra["cpu_bytes_to_use"] == 32 * 2**30
        assert extra["disk_bytes_to_use"] == 250 * 2**30


def test_kv_offload_mooncake_stages_and_clients():
    job = B(make("inference", inference={"nodes": 3, "tp": 2, "kv_offload": {"kind": "mooncake", "cpu_gb": 128}}))
    p = job.plan
    master, client, inf = (p.component(n) for n in ("mooncake-master", "mooncake-client", "inference"))
    assert master.stage < client.stage < inf.stage
    order = [s.components for s in p.stages]
    flat = [n for s in order for n in s]
    assert flat.index("mooncake-master") < flat.index("mooncake-client") < flat.index("inference")
    assert not (set(order[[i for i, s in enumerate(order) if "mooncake-client" in s][0]]) & {"inference"})
    assert client.tasks_per_node == 1 and client.nodes == inf.nodes == 3
    assert sorted(i.node for i in client.instances) == [0, 1, 2]
    assert master.nodes == 1 and master.group == inf.group and master.first_node == 0
    head = f"g{inf.group}n0"
    rpc, meta = port(p, "mooncake_rpc"), port(p, "mooncake_metadata")
    for _, e in job.tasks("inference"):
        assert kv_cfg(e)["kv_connector"] == "MooncakeStoreConnector"
        assert e.env["MOONCAKE_MASTER"] == f"{head}:{rpc}"
        assert e.env["MOONCAKE_METADATA_SERVER"] == f"http://{head}:{meta}/metadata"
    # one client per inference node, each pointing at the master and naming its own host
    for i, e in job.tasks("mooncake-client"):
        assert prefixed(e.command, "--master_server_address=") == f"{head}:{rpc}"
        assert prefixed(e.command, "--metadata_server=") == f"http://{head}:{meta}/metadata"
        assert prefixed(e.command, "--local_hostname=") == job.host(client, i)
        assert "--global_segment_size=128 GB" in e.command
    for name in ("mooncake-master", "mooncake-client", "inference"):
        assert_tasks_match_instances(job, name)
    assert "mooncake-master" in p.services


# ---- ports -------------------------------------------------------------------------------------


def test_port_base_differs_for_jobs_in_one_window():
    for start in (0, 1, 12345, 9_999_999):
        bases = [ports.base_for_job(j) for j in range(start, start + ports.SLOTS)]
        assert len(set(bases)) == ports.SLOTS
        assert min(bases) >= ports.BASE_MIN and max(bases) + ports.STRIDE <= 32768
    # the script computes the same base as the table
    for j in (0, 1, 271, 272, 123457):
        assert eval(ports.base_expr(), {"SLURM_JOB_ID": j}) == ports.base_for_job(j)


def _shapes() -> list[dict]:
    return [read_toml(r) for r in RECIPES] + [
        make("inference", inference={"tp": 1, "dp": 1}),
        make("inference", inference={"nodes": 2, "tp": 2, "dp": 2, "router": {"enabled": True}}),
        make("inference", inference={"mode": "pd", "prefill": {"replicas": 8, "tp": 1},
                                     "decode": {"replicas": 2, "tp": 4}}),
        make("inference", inference={"mode": "pd", "kv_connector": "MooncakeConnector",
                                     "prefill": {"replicas": 4, "tp": 2}, "decode": {"replicas": 8, "tp": 1}}),
        # workers spanning nodes, replicas of them, P/D sharing nodes, offload with P/D
        make("inference", inference={"nodes": 4, "tp": 1, "dp": 16}),
        make("inference", inference={"mode": "pd", "prefill": {"replicas": 2, "tp": 1, "dp": 16, "expert_parallel": True},
                                     "decode": {"replicas": 1, "tp": 2, "dp": 8, "expert_parallel": True}}),
        make("inference", inference={"mode": "pd", "kv_connector": "MooncakeConnector",
                                     "prefill": {"replicas": 2, "tp": 2, "dp": 8}, "decode": {"replicas": 1, "dp": 16}}),
        make("inference", inference={"mode": "pd", "share_nodes": True, "kv_offload": {"kind": "cpu", "cpu_gb": 8},
                                     "prefill": {"replicas": 6, "tp": 1, "nodes": 2},
                                     "decode": {"replicas": 2, "tp": 1, "dp": 2}}),
        make("inference", inference={"mode": "pd", "share_nodes": True,
                                     "kv_offload": {"kind": "mooncake", "cpu_gb": 8},
                                     "prefill": {"replicas": 1, "tp": 2, "dp": 4, "nodes_per_worker": 2},
                                     "decode": {"replicas": 1, "tp": 2, "dp": 4, "nodes_per_worker": 2}}),
        make("inference", inference={"mode": "pd", "kv_offload": {"kind": "mooncake", "cpu_gb": 8},
                                     "prefill": {"replicas": 2, "tp": 4}, "decode": {"replicas": 2, "tp": 8}}),
        make("inference", inference={"nodes": 2, "kv_offload": {"kind": "mooncake", "cpu_gb": 8}}),
        rl(placement={"colocate": True}, inference={"gpus_per_node": 6}, trainer={"gpus_per_node": 2}),
        rl(placement={"colocate": True}, inference={"gpus_per_node": 4, "tp": 2}),
        rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True}),
    ] + [_rl_multi_data(p) for p in ("trainer", "inference", "own")]


SHAPES = _shapes()


def _ids():
    return [f"{i}-{d['name']}-{d['kind']}" for i, d in enumerate(SHAPES)]


@pytest.mark.parametrize("data", SHAPES, ids=_ids())
def test_ports_unique_per_plan_and_per_node(data):
    job = B(copy.deepcopy(data))
    p = job.plan
    offs = list(p.ports.values())
    assert len(offs) == len(set(offs)), p.ports
    assert all(0 <= o < ports.STRIDE for o in offs), p.ports
    for name, off in p.ports.items():
        assert ports.offset(name) == off
    # the script's port table is the plan's, and every port a task function names is in it
    table = dict(re.findall(r"^export PORT_([A-Z0-9_]+)=\$\(\(PORT_BASE \+ (\d+)\)\)$", job.script, re.M))
    assert table == {k.upper(): str(off) for k, off in p.ports.items()}
    assert set(re.findall(r"\bPORT_([A-Z0-9_]+)\b", task_functions(job.script))) <= set(table)
    per_node: dict[tuple[int, int], list[int]] = {}
    nixl: dict[tuple[int, int], list[range]] = {}
    for c in p.components:
        for i, e in job.tasks(c.name):
            assert e.env["PORT_BASE"] == str(base(p))
            key = (c.group, c.first_node + i.node)
            heard = listens(job, c, i, e)
            assert heard == {k: port(p, n) for k, n in i.ports.items()}, (c.name, i)
            per_node.setdefault(key, []).extend(heard.values())
            if "VLLM_NIXL_SIDE_CHANNEL_PORT" in e.env:  # one side channel per engine (data-parallel rank)
                nixl.setdefault(key, []).extend(v for k, v in heard.items() if k.startswith("kv"))
    for key, used in per_node.items():
        assert len(used) == len(set(used)), (key, used)  # engines of two servers never share a port
    for key, used in nixl.items():
        assert base(p) + ports.offset("nixl_0") <= min(used), used
        assert max(used) < base(p) + ports.offset("dprpc_0"), used  # stays inside the NIXL block


def test_nixl_ranges_do_not_overlap_with_mixed_tp():
    job = B(make("inference", inference={"mode": "pd", "prefill": {"replicas": 2, "tp": 4},
                                         "decode": {"replicas": 4, "tp": 2}}))
    for name in ("prefill", "decode"):
        tasks = job.tasks(name)
        starts = sorted(int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for _, e in tasks)
        tp = int(tasks[0][1].after("--tensor-parallel-size"))
        assert tp == len(tasks[0][0].gpus)
        assert all(b - a >= tp for a, b in zip(starts, starts[1:])), starts


# ---- CPUs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", SHAPES, ids=_ids())
def test_cpu_split_fits_every_node(data):
    p = P(copy.deepcopy(data))
    limit = data["slurm"].get("cpus_per_node", 16)
    for g in p.groups:
        assert g.cpus_per_node <= limit
        for node in range(g.nodes):
            used = sum(
                c.tasks_per_node * c.cpus_per_task
                for c in p.components
                if c.group == g.index and c.first_node <= node < c.first_node + c.nodes
            )
            assert 0 < used <= g.cpus_per_node, (g.name, node, used, g.cpus_per_node)
    for c in p.components:
        assert c.cpus_per_task >= 1
        assert f"--cpus-per-task={c.cpus_per_task}" in srun_strs(c)


# ---- determinism and immutability --------------------------------------------------------------


@pytest.mark.parametrize("data", SHAPES, ids=_ids())
def test_plan_is_deterministic(data):
    a = P(copy.deepcopy(data)).model_dump_json()
    b = P(copy.deepcopy(data)).model_dump_json()
    assert a == b


def test_plan_is_frozen():
    p = P(rl(placement={"colocate": True}, inference={"gpus_per_node": 6}))
    with pytest.raises(ValidationError):
        p.name = "other"
    with pytest.raises(ValidationError):
        p.components[0].nodes = 99
    with pytest.raises(ValidationError):
        p.groups[0].directives[0].value = "x"
    with pytest.raises(ValidationError):
        p.components[0].task = p.components[1].task
    with pytest.raises((TypeError, AttributeError)):
        p.components[0].instances[0].gpus[0] = 3  # tuples
    with pytest.raises((TypeError, AttributeError)):
        p.components[0].task.command[0] = "x"  # tuples


def test_planning_does_not_change_the_recipe():
    r = validate(rl(placement={"colocate": True, "share_gpus": True}, slurm={"gpus_per_node": 1, "cpus_per_node": 8}))
    before = r.model_dump_json()
    plan(r, RUN)
    plan(r, RUN)
    assert r.model_dump_json() == before
    assert r.inference.gpu_memory_utilization is None


# ---- the gallery -------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_gallery_every_task_expands(recipe):
    """Every task function of every gallery recipe runs for every instance and execs its supervisor
    around a command; GPU slices and listening ports are the instance's."""
    job = B(read_toml(recipe))
    for c in job.plan.components:
        tasks = job.tasks(c.name)
        assert len(tasks) == c.nodes * c.tasks_per_node, c.name
        for i, e in tasks:
            assert e.supervisor[1:4] == ["-m", "slurmrl.runtime.steps.supervise", c.name] or (
                e.supervisor[0] == "uv" and "slurmrl.runtime.steps.supervise" in e.supervisor), (c.name, e.supervisor)
            assert e.command, c.name
            assert e.env["SLURM_NODEID"] == str(i.node) and e.env["SLURM_LOCALID"] == str(i.local)
        assert_tasks_match_instances(job, c.name)
