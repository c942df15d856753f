"""Preflight probe: stands in for a component with the exact same srun layout.

It reports where it runs (host, GPUs, container flags, environment), binds and serves every
port the plan gives it (HTTP 200 on any path, so the script's readiness checks pass), checks it
can reach every other component's host:port, and writes ``preflight/<component>.<rank>.json``
in the run dir. Main components exit once every probe has reported; the others serve until the
script stops them. Exit code 3 when this probe found a problem.

    python -m slurmrl.runtime.steps.probe NAME      (inside the job: finds its task in RUN_DIR/plan.json)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from slurmrl import envs
from slurmrl.contract import job_env
from slurmrl.contract.probe_report import REPORTED_ENV, ProbeReport
from slurmrl.contract.views import OrchestratorView, PlanView, TrainerView
from slurmrl.envs.protocol import refuse_chat_only
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready
from slurmrl.runtime.step_files import write_json_atomic
from slurmrl.runtime.steps import component as rt
from slurmrl.runtime.steps import container, fabric
from slurmrl.runtime.steps.supervise import narrow_gpus, tcp_ok
from slurmrl.runtime.trainer import dataset

DEADLINE_S = job_env.probe_timeout()


class _ProbeServer(ThreadingHTTPServer):
    probe_name = ""  # the component it stands in for, in each health reply


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        body = json.dumps({"probe": self.server.probe_name}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep the step log for the report
        pass


def serve(ports: dict[str, int], name: str) -> tuple[list, list[str]]:
    servers, errors = [], []
    for purpose, number in ports.items():
        try:
            srv = _ProbeServer(("0.0.0.0", number), _Health)
        except OSError as e:
            errors.append(f"port {number} ({purpose}) cannot be bound: {e.strerror}")
            continue
        srv.probe_name = name
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    return servers, errors


def peers(plan: PlanView, me: tuple[str, int]) -> list[tuple[str, str, int]]:
    """(label, host, port) of every port every other instance in the plan listens on."""
    out = []
    for c in plan.components:
        for inst in c.instances:
            if (c.name, inst.rank) == me:
                continue
            host = rt.hosts(c.group)[c.first_node + inst.node]
            for name in inst.ports.values():
                out.append((f"{c.name}.{inst.rank}", host, rt.port(name)))
    return out


STOP = threading.Event()  # set by SIGTERM/SIGINT: the script is stopping us


def check_peers(targets: list[tuple[str, str, int]], deadline: float) -> list[str]:
    pending = list(targets)
    while pending and time.monotonic() < deadline and not STOP.is_set():
        pending = [t for t in pending if not tcp_ok(t[1], t[2])]
        if pending:
            STOP.wait(1)
    return [f"cannot reach {label} at {host}:{port}" for label, host, port in pending]


def allocation() -> dict[str, str]:
    """Each het group's node list as Slurm gave it to the step (group "0" alone for a plain job)."""
    prefix = "SLURM_JOB_NODELIST_HET_GROUP_"
    groups = {k.removeprefix(prefix): v for k, v in sorted(os.environ.items()) if k.startswith(prefix)}
    if not groups and os.environ.get("SLURM_JOB_NODELIST"):
        groups = {"0": os.environ["SLURM_JOB_NODELIST"]}
    return groups


def environment_problems(run_dir) -> list[str]:
    """Load the orchestrator's environment here, with the job's Python and PYTHONPATH on a node,
    before any server starts, and [eval]'s own eval.environment when it names one: a wrong class
    path or argument is found by the preflight, and so is a chat-only setting the recipe gives a custom
    text environment (the planner refuses it for a built-in one)."""
    try:
        path = RunDir(run_dir).component_config("orchestrator")
        with open(path, "rb") as f:
            settings = OrchestratorView.from_json(tomllib.load(f), str(path))
        env = envs.load(settings.environment.name, settings.environment.args)
        if settings.judge and not env.has("use_judge"):
            return [f"environment {settings.environment.name!r} has no use_judge(judge), so it cannot score through "
                    "the job's [judge]"]
        env.preflight()  # what the environment reads at run time, e.g. the judge environment's dataset
        loaded = {"orchestrator.environment": env}
        if settings.eval_environment is not None:
            try:
                loaded["eval.environment"] = envs.load(settings.eval_environment.name, settings.eval_environment.args,
                                                       "eval.environment")
            except SystemExit as e:
                why = str(e.code).removeprefix("slurmrl: ")
                return [why if why.startswith("eval.environment: ") else f"eval.environment: {why}"]
        refuse_chat_only(loaded, list(settings.chat_only_set))
    except SystemExit as e:
        return [str(e.code).removeprefix("slurmrl: ")]
    except (OSError, KeyError, ValueError) as e:
        return [f"cannot read the orchestrator's settings: {e}"]
    return []


def dataset_problems(run_dir) -> list[str]:
    """SFT: the trainer's dataset, looked up here as the trainer will (same node, container and start
    directory): plan can only tell a hub id from a path, not whether the file is there."""
    try:
        path = RunDir(run_dir).component_config("trainer")
        with open(path, "rb") as f:
            settings = TrainerView.from_json(tomllib.load(f), str(path))
    except (OSError, ValueError) as e:
        return [f"cannot read the trainer's settings: {e}"]
    if settings.kind != "sft" or settings.dataset is None:
        return []
    why = dataset.problem(settings.dataset, Path(run_dir))
    return [why] if why else []


def gpu_spec(positions: list[int]) -> str | None:
    return f"{positions[0]}:{len(positions)}" if positions else None


def mark_ready(comp: rt.Component, ports: dict[str, int]) -> None:
    """The same ready file the supervisor writes, so the script's readiness waits pass."""
    url = f"http://{socket.gethostname()}:{ports['http']}" if "http" in ports else None
    ntasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)
    task = int(os.environ.get("SLURM_PROCID", comp.rank))
    write_ready(RunDir(comp.run_dir).ready_file(RunDir.attempt_from_env(), comp.name, task), url, ntasks)


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        raise SystemExit("usage: python -m slurmrl.runtime.steps.probe COMPONENT (inside the job script)")
    comp = rt.load(sys.argv[1])
    deadline = time.monotonic() + DEADLINE_S
    seen_before = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    errors = []
    gpus: list[str] = []
    spec = gpu_spec(list(comp.instance.gpus))
    if spec:
        try:
            gpus = narrow_gpus(spec, os.environ)
        except SystemExit as e:
            errors = [str(e)]
    if comp.name == "orchestrator":
        errors += environment_problems(comp.run_dir)
    if comp.name == "trainer":  # every node reads the file
        errors += dataset_problems(comp.run_dir)
    my_ports = {purpose: rt.port(name) for purpose, name in comp.instance.ports.items()}
    servers, bind_errors = serve(my_ports, comp.name)
    errors += bind_errors
    mark_ready(comp, my_ports)
    plan = comp.plan
    errors += check_peers(peers(plan, (comp.name, comp.rank)), deadline)
    report = ProbeReport(
        component=comp.name, rank=comp.rank, host=socket.gethostname(),
        node=comp.instance.node, local=comp.instance.local,
        gpus_seen=tuple(g for g in seen_before.split(",") if g), gpus=tuple(gpus),
        gpu_positions=tuple(comp.instance.gpus),
        ports=my_ports,
        container=container.observe(),
        env={k: os.environ[k] for k in REPORTED_ENV if k in os.environ},
        allocation=allocation(),
        errors=tuple(errors),
        # slurm.nvlink_domain: this node's NVLink fabric (nvidia-smi -q), where the plan asks for one domain
        fabric=fabric.node_fabric() if comp.config.group in plan.nvlink_domain else None,
    )
    out_dir = RunDir(comp.run_dir).preflight_dir()
    write_json_atomic(RunDir(comp.run_dir).preflight_report(comp.name, comp.rank), report.to_json(), indent=1)
    print(report.dumps(), flush=True)
    total = plan.tasks
    while len(list(out_dir.glob("*.json"))) < total and time.monotonic() < deadline and not STOP.is_set():
        STOP.wait(0.5)  # stay reachable until every probe has checked us
    if STOP.is_set():
        return 143
    if errors:
        return 3
    if not comp.config.main:
        STOP.wait()  # a service: serve until the script stops us
    for srv in servers:
        srv.shutdown()
    return 0


if __name__ == "__main__":
    for _sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_sig, lambda *_: STOP.set())
    sys.exit(main())
