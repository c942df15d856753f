"""Run real components (vLLM servers, vllm-router, Mooncake) on loopback, outside Slurm.

Each runs its task function from a really rendered job.sbatch (``bash -c task_NAME``, the same
command line srun runs); the environment the batch shell and srun would give it (the port
table, ``HEAD_G<n>``, ``URLS_*``, ``SLURM_NODEID``/``SLURM_LOCALID``/``SLURM_PROCID``) is set
here, with every node mapped to 127.0.0.1. Processes are stopped by pid.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from worker_ports import worker_order

from slurmrl import secret
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps.supervise import http_ok
from slurmrl.runtime.vllm import plugin

ROOT = Path(__file__).resolve().parents[2]
TEST_SECRET = "test-secret-of-the-live-components"  # every LiveComponent's run dir gets this secret


def serve_recipe(model, name: str = "serve", servers: int = 2, policy: str = "round_robin",
                 max_lora_rank: int | None = None, weight_transfer: str | None = None,
                 tool_call_parser: str | None = None) -> str:
    """An inference recipe for `servers` tiny-model vLLM servers on one node, admin endpoints on;
    ``weight_transfer``: a backend their ``--weight-transfer-config`` names (an RL job's planner adds
    it from trainer.weight_sync; an inference job takes it as an extra argument)."""
    lora = f"max_lora_rank = {max_lora_rank}\n" if max_lora_rank else ""
    lora += f'tool_call_parser = "{tool_call_parser}"\n' if tool_call_parser else ""
    if weight_transfer:
        lora += f"""extra_args = ["--weight-transfer-config", '{{"backend": "{weight_transfer}"}}']\n"""
    return f"""
name = "{name}"
kind = "inference"
[slurm]
gpus_per_node = {servers}
cpus_per_node = 8
[model]
path = "{model}"
served_name = "tiny"
dtype = "float32"
max_model_len = 256
[inference]
tp = 1
enforce_eager = true
startup_timeout = 600
admin_endpoints = true
{lora}[inference.env]
VLLM_CPU_KVCACHE_SPACE = "1"
""" + (f'[inference.router]\npolicy = "{policy}"\n' if servers > 1 else "")  # one server: no router to configure


def transformers_logprobs(model_dir, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """Log-probabilities transformers gives ``completion_ids`` after ``prompt_ids`` (float32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    n = len(prompt_ids)
    return [logp[n - 1 + i, t].item() for i, t in enumerate(completion_ids)]


def vllm_plugin_on_path(tmp: Path) -> None:
    """slurmrl's vLLM plugin visible to the servers this test process starts (``plugin.make_visible``)."""
    plugin.make_visible(tmp)


def free_loopback_base(offsets, bases) -> int:
    """The first of ``bases`` (in this xdist worker's order) where every ``base + offset`` is free on
    loopback right now."""
    for base in worker_order(bases):
        socks = []
        try:
            for off in offsets:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + off))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports on loopback")


def free_port_base(span: int = 80) -> int:
    """A PORT_BASE whose first `span` ports are free on loopback right now."""
    return free_loopback_base((0, 1, 16, 17, 18), range(30000, 32000, span))


def post_json(url: str, body: dict, headers: dict | None = None, timeout: float = 120) -> dict:
    """POST with the job's secret (from $SLURMRL_SECRET_FILE, as a job step has it) unless ``headers`` say otherwise."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **secret.headers(), **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def task_functions(script: str) -> str:
    """Every ``task_NAME() { ... }`` with its ``export -f`` line, from a rendered job.sbatch."""
    found = re.findall(r"^(task_\w+\(\) \{\n.*?^\}\nexport -f task_\w+\n)", script, re.M | re.S)
    assert found, "no task functions in the script"
    return "".join(found)


def port_table(run_dir: Path, port_base: int) -> dict[str, str]:
    """PORT_<NAME> for every port in plan.json, as the script's port table exports them."""
    plan = json.loads((run_dir / "plan.json").read_text())
    return {f"PORT_{k.upper()}": str(port_base + off) for k, off in plan["ports"].items()}


class LiveComponent:
    def __init__(self, run_dir: Path, name: str, port_base: int, node: int = 0, local: int = 0, groups: int = 1,
                 extra_env: dict | None = None, tasks: int = 1):
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # as if the venv were activated
            **port_table(run_dir, port_base),
            "RUN_DIR": str(run_dir),
            "SLURMRL_PORT_BASE": str(port_base),
            "SLURMRL_RUN_DIR": str(run_dir),
            "SLURMRL_ATTEMPT": "0",
            "SLURM_JOB_ID": "1",
            "SLURM_NODEID": str(node),
            "SLURM_LOCALID": str(local),
            "SLURM_PROCID": str(local),
            "SLURM_STEP_NUM_TASKS": str(tasks),
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            **{f"SLURMRL_NODES_G{g}": "127.0.0.1" for g in range(groups)},
            **{f"HEAD_G{g}": "127.0.0.1" for g in range(groups)},
            **(extra_env or {}),
        }
        secret_file = run_dir / secret.FILE  # what the job script makes; the test process uses it too
        if not secret_file.exists():
            secret_file.write_text(TEST_SECRET)
        env[secret.ENV] = str(secret_file)
        os.environ.setdefault(secret.ENV, str(secret_file))
        self.ready_file = RunDir(run_dir).ready_file(0, name, local)
        self.ready_file.unlink(missing_ok=True)  # a ready file of an earlier start of this task
        self.log_path = run_dir / "logs" / f"{name}.{local}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "wb")
        functions = task_functions((run_dir / "job.sbatch").read_text())
        fn = "task_" + name.replace("-", "_")
        self.proc = subprocess.Popen(
            ["bash", "-c", f"set -euo pipefail\n{functions}\n{fn}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=run_dir,
        )

    def wait_http(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}:\n{self.tail()}")
            if http_ok(url):
                return
            time.sleep(1)
        raise TimeoutError(f"{url} not ready after {timeout}s:\n{self.tail()}")

    def wait_ready(self, timeout: float) -> None:
        """Until the supervisor writes the task's ready file (for a router: its workers are listed and
        one completion through it returned a token)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}:\n{self.tail()}")
            if self.ready_file.exists():
                return
            time.sleep(0.5)
        raise TimeoutError(f"no {self.ready_file} after {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
