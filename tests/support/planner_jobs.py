"""The planner tests' shared harness (tests/test_planner_shapes.py, tests/test_planner_invariants.py):
recipes written from dicts, rendered jobs, and what every task of every component really execs.

The script is the truth: each component's command line stands once in job.sbatch as a task
function, and what differs per task (port, GPU slice, NIXL port, data-parallel rank, headless) is
shell arithmetic on SLURM_NODEID / SLURM_LOCALID and the port table. So the shapes are checked on
what each task would exec: ``tests/support/task_expand.py`` runs the script's prologue and the task
function in real bash with the programs replaced by a recorder, for every instance (node, local).
The URLs a stage hands on (URLS_INFERENCE, URLS_PREFILL, ...) are the ready URLs the servers'
supervisors were given, in task order, as the batch shell reads them from their ready files.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

from task_expand import JOB_ID, PROGRAMS, RECORDER, Expanded, expand

from slurmrl import ports
from slurmrl.app.build import Rendered, build
from slurmrl.plan import plan
from slurmrl.plan.model import Component, Instance, Plan
from slurmrl.recipe.load import validate
from slurmrl.rundir import tomlw

ROOT = Path(__file__).resolve().parents[2]
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


def sglang_ports(e: Expanded) -> dict[str, int]:
    """An SGLang worker's first node: --dist-init-addr's port, a prefill worker's bootstrap server."""
    out = {}
    if "--dist-init-addr" in e.command:
        out["dist"] = int(e.after("--dist-init-addr").rpartition(":")[2])
    if "--disaggregation-bootstrap-port" in e.command:
        out["bootstrap"] = int(e.after("--disaggregation-bootstrap-port"))
    return out


def listens(job: Job, c: Component, inst: Instance, e: Expanded) -> dict[str, int]:
    """The ports a task listens on, by purpose, read off what it execs."""
    cmd = e.command
    if c.role == "inference" and "sglang.launch_server" in cmd:  # SGLang: a server's first node serves HTTP
        if "--node-rank" in cmd and e.after("--node-rank") != "0":  # and hosts --dist-init-addr
            return {}
        return {"http": int(e.after("--port")), **sglang_ports(e)}
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
        # data parallel: a task's first rank (per rank, or per node from its start rank); rank 0 hosts the RPC
        first = int(e.after("--data-parallel-rank") if "--data-parallel-rank" in cmd else
                    e.after("--data-parallel-start-rank") if "--data-parallel-start-rank" in cmd else 0)
        if "--data-parallel-rpc-port" in cmd and first == 0:
            out["dp_rpc"] = int(e.after("--data-parallel-rpc-port"))
        if "VLLM_NIXL_SIDE_CHANNEL_PORT" in e.env:  # vLLM adds each engine's DP rank to the base
            local = int(e.after("--data-parallel-size-local")) if "--data-parallel-size-local" in cmd else 1
            for k in range(local):
                out[f"kv{k or ''}"] = int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + first + k
        if "dynamo.sglang" in cmd and not ("--node-rank" in cmd and e.after("--node-rank") != "0"):
            out.update(sglang_ports(e))  # a worker's first node
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


def rl_multi_data(placement: str) -> dict:
    own = {"cpu_partition": "cpu"} if placement == "own" else {}  # refused where there is no CPU-only group
    return rl(cpus=32, trainer={"nodes": 2, "micro_batch_size": 1},
              orchestrator={"placement": placement, "prompts_per_step": 16, "rollouts_per_prompt": 8},
              inference={"nodes": 2, "tp": 2},
              slurm={"gpus_per_node": 8, "cpus_per_node": 32, "partition": "gpu", **own})
