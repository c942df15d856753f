"""Run a component's task function from a rendered job.sbatch in real bash, as one task of its
srun step would (``SLURM_NODEID``/``SLURM_LOCALID`` set, the port table exported), with the
programs it execs replaced by a recorder: the test sees the exact argv and environment each
task would start. Test double: the recorder stands in for python3 / torchrun / vllm-router /
mooncake_* / etcd / nats-server / trtllm-llmapi-launch, nothing else is faked.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from slurmrl import ports
from slurmrl.plan.model import Plan
from slurmrl.render.script import FUNCTIONS, FUNCTIONS_VERSION, render_functions

PROGRAMS = ("python3", "torchrun", "vllm-router", "mooncake_master", "mooncake_client", "uv",
            "etcd", "nats-server", "trtllm-llmapi-launch")
RECORDER = """#!/bin/bash
printf '%s\\0' "$0" "$@" >"$EXPAND_OUT/argv"
env -0 >"$EXPAND_OUT/env"
"""
JOB_ID = 7  # the job id the faked batch environment has


@dataclass
class Expanded:
    argv: list[str]  # what the task execs: the supervisor and, after "--", the command
    env: dict[str, str]

    @property
    def supervisor(self) -> list[str]:
        return self.argv[: self.argv.index("--")] if "--" in self.argv else []

    @property
    def command(self) -> list[str]:
        return self.argv[self.argv.index("--") + 1:] if "--" in self.argv else self.argv

    def after(self, flag: str) -> str:
        args = self.command
        return args[args.index(flag) + 1]


def task_functions(script: str) -> str:
    found = re.findall(r"^(task_[\w]+\(\) \{\n.*?^\}\nexport -f task_\w+\n)", script, re.M | re.S)
    assert found, "no task functions in the script"
    return "".join(found)


def port_env(plan: Plan) -> dict[str, str]:
    """PORT_<NAME> as the script's port table computes them for job JOB_ID."""
    base = plan.port_base or ports.base_for_job(JOB_ID)
    return {f"PORT_{k.upper()}": str(base + off) for k, off in plan.ports.items()}


STUBS = """
scontrol() { tr ',' '\\n' <<<"$3"; }  # scontrol show hostnames A,B -> one host per line
srun() { return 0; }                 # the port claim steps: every node grants the first block
"""


def inline_functions(script: str) -> str:
    """The script with its `source` of the helper file (RUN_DIR/slurmrl-functions.sh) replaced by
    the helper's text, so it runs without a rendered run dir."""
    line = f'source -- "${{RUN_DIR}}/{FUNCTIONS}" {FUNCTIONS_VERSION}\n'
    assert line in script, "the script does not source the helper file"
    script = re.sub(rf"^\[\[ -r \${{RUN_DIR}}/{re.escape(FUNCTIONS)} \]\] .*\n", "", script, count=1, flags=re.M)
    return script.replace(line, f"set -- {FUNCTIONS_VERSION}\n{render_functions()}set --\n", 1)


def prologue(script: str, scratch: Path) -> str:
    """The batch shell's part of the script before the first stage starts, with its log and
    ready folders moved to ``scratch`` (the run dir itself is left alone)."""
    text = inline_functions(script[: script.index("\n# ---- stage ")])
    text = re.sub(r"^LOG_DIR=.*$", f"LOG_DIR={scratch}/logs", text, count=1, flags=re.M)
    return re.sub(r"^READY_DIR=.*$", f"READY_DIR={scratch}/ready", text, count=1, flags=re.M)


def expand(script: str, plan: Plan, name: str, node: int = 0, local: int = 0, env: dict | None = None,
           hosts: dict[int, list[str]] | None = None) -> Expanded:
    """The argv and environment task (node, local) of component ``name`` would exec.

    The script's own prologue runs first (with Slurm's batch environment faked: job id, node
    lists), so the task sees exactly what the batch shell exports; then the step's variables
    (SLURM_NODEID, SLURM_LOCALID, SLURM_PROCID) and ``env`` (e.g. URLS_* a stage exports)."""
    comp = plan.component(name)
    hosts = hosts or {g.index: [f"g{g.index}n{i}" for i in range(g.nodes)] for g in plan.groups}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for prog in PROGRAMS:
            (bin_dir / prog).write_text(RECORDER)
            (bin_dir / prog).chmod(0o755)
        batch_env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "EXPAND_OUT": str(tmp),
            "SLURM_JOB_ID": str(JOB_ID),
            "SLURM_JOB_NODELIST": ",".join(hosts[0]),
            **({"SLURM_HET_SIZE": str(len(hosts))} if len(hosts) > 1 else {}),
            **{f"SLURM_JOB_NODELIST_HET_GROUP_{g}": ",".join(n) for g, n in hosts.items()},
        }
        step = {
            "SLURM_NODEID": str(node),
            "SLURM_LOCALID": str(local),
            "SLURM_PROCID": str(node * comp.tasks_per_node + local),
            **(env or {}),
        }
        fake_host = hosts[comp.group][comp.first_node + node]
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in step.items())
        body = (f"{STUBS}\n{prologue(script, tmp)}\n{exports}"
                f"hostname() {{ echo {fake_host}; }}\n{comp.function} >/dev/null\n")
        r = subprocess.run(["bash", "-c", body], env=batch_env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        argv = (tmp / "argv").read_bytes().decode().split("\0")[:-1]
        raw = (tmp / "env").read_bytes().decode().split("\0")[:-1]
    argv[0] = Path(argv[0]).name
    exported = dict(item.split("=", 1) for item in raw)
    noise = ("PWD", "SHLVL", "_", "OLDPWD")
    return Expanded(argv=argv, env={
        k: v for k, v in exported.items()
        if k not in noise and not k.startswith("BASH_FUNC_")
    })


def dump(e: Expanded) -> str:
    return json.dumps({"argv": e.argv, "env": e.env}, indent=1)
