"""Run a component's task function from a rendered job.sbatch in real bash, as one task of its
srun step would (``SLURM_NODEID``/``SLURM_LOCALID`` set, the port table exported), with the
programs it execs replaced by a recorder: the test sees the exact argv and environment each
task would start. Test double: the recorder stands in for python3 / torchrun / vllm-router /
mooncake_*, nothing else is faked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from slurmrl.plan.model import Plan

PROGRAMS = ("python3", "torchrun", "vllm-router", "mooncake_master", "mooncake_client")
RECORDER = """#!/bin/bash
printf '%s\\0' "$0" "$@" >"$EXPAND_OUT/argv"
env -0 >"$EXPAND_OUT/env"
"""
PORT_BASE = 20000


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


def port_env(plan: Plan, base: int = PORT_BASE) -> dict[str, str]:
    return {f"PORT_{k.upper()}": str(base + off) for k, off in plan.ports.items()}


def expand(script: str, plan: Plan, name: str, node: int = 0, local: int = 0, env: dict | None = None,
           hosts: dict[int, list[str]] | None = None) -> Expanded:
    """The argv and environment task (node, local) of component ``name`` would exec."""
    comp = plan.component(name)
    hosts = hosts or {g.index: [f"g{g.index}n{i}" for i in range(g.nodes)] for g in plan.groups}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for prog in PROGRAMS:
            (bin_dir / prog).write_text(RECORDER)
            (bin_dir / prog).chmod(0o755)
        full_env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "EXPAND_OUT": str(tmp),
            "RUN_DIR": "/run-dir",
            "SLURM_JOB_ID": "7",
            "SLURM_NODEID": str(node),
            "SLURM_LOCALID": str(local),
            "SLURM_PROCID": str(node * comp.tasks_per_node + local),
            **port_env(plan),
            **{f"SLURMRL_NODES_G{g}": " ".join(n) for g, n in hosts.items()},
            **{f"HEAD_G{g}": n[0] for g, n in hosts.items()},
            **(env or {}),
        }
        fake_host = hosts[comp.group][comp.first_node + node]
        body = f"hostname() {{ echo {fake_host}; }}\nset -euo pipefail\n{task_functions(script)}\n{comp.function}\n"
        r = subprocess.run(["bash", "-c", body], env=full_env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        argv = (tmp / "argv").read_bytes().decode().split("\0")[:-1]
        raw = (tmp / "env").read_bytes().decode().split("\0")[:-1]
    argv[0] = Path(argv[0]).name
    exported = dict(item.split("=", 1) for item in raw)
    noise = ("PWD", "SHLVL", "_", "OLDPWD")
    return Expanded(argv=argv, env={
        k: v for k, v in exported.items()
        if full_env.get(k) != v and k not in noise and not k.startswith("BASH_FUNC_")
    })


def dump(e: Expanded) -> str:
    return json.dumps({"argv": e.argv, "env": e.env}, indent=1)
