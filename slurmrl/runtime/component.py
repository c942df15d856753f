"""What every runtime needs: its component config, its own instance, hosts, ports, GPUs.

A component is one ``srun``; its tasks find their instance by ``SLURM_NODEID`` (node index
within the step) and ``SLURM_LOCALID`` (task index on the node). Hostnames and ``PORT_BASE`` are
known only at run time; the script exports them as ``SLURMRL_NODES_G<n>`` and
``SLURMRL_PORT_BASE``. Config strings may hold ``{host:G:N}``, ``{host:self}``, ``{port:NAME}``
and ``{run_dir}`` placeholders, filled in here.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path

from slurmrl.plan import ports


@dataclass(frozen=True)
class Component:
    config: dict
    instance: dict

    @property
    def name(self) -> str:
        return self.config["name"]

    @property
    def run_dir(self) -> Path:
        return Path(self.config["run_dir"])

    @property
    def rank(self) -> int:
        return self.instance["rank"]

    @property
    def settings(self) -> dict:
        return self.config.get("settings", {})


def load(path: str | Path, env: dict | None = None) -> Component:
    env = os.environ if env is None else env
    with open(path, "rb") as f:
        config = tomllib.load(f)
    node = int(env.get("SLURM_NODEID", 0))
    local = int(env.get("SLURM_LOCALID", 0))
    for inst in config.get("instances", []):
        if inst["node"] == node and inst["local"] == local:
            return Component(config, inst)
    raise SystemExit(f"slurmrl: {config['name']}: no instance for node {node} task {local} in {path}")


def hosts(group: int, env: dict | None = None) -> list[str]:
    env = os.environ if env is None else env
    value = env.get(f"SLURMRL_NODES_G{group}")
    if value is None:
        raise SystemExit(f"slurmrl: SLURMRL_NODES_G{group} is not set; run this inside the job script")
    return value.split()


def port(name: str, env: dict | None = None) -> int:
    env = os.environ if env is None else env
    return int(env["SLURMRL_PORT_BASE"]) + ports.offset(name)


def endpoint(ep: dict, env: dict | None = None) -> tuple[str, int]:
    """``{group, node, port}`` from a component config -> (host, port)."""
    return hosts(ep["group"], env)[ep["node"]], port(ep["port"], env)


_PLACEHOLDER = re.compile(r"\{(host|port|run_dir)(?::([^}]*))?\}")


def fill(text: str, comp: Component, env: dict | None = None) -> str:
    def sub(m: re.Match) -> str:
        kind, arg = m.group(1), m.group(2)
        if kind == "run_dir":
            return str(comp.run_dir)
        if kind == "port":
            return str(port(arg, env))
        if arg == "self":
            return socket.gethostname()
        group, node = arg.split(":")
        return hosts(int(group), env)[int(node)]

    return _PLACEHOLDER.sub(sub, text)


def narrow_gpus(comp: Component, env: dict | None = None) -> list[str]:
    """Keep only this instance's GPU positions in CUDA_VISIBLE_DEVICES; returns the ids kept."""
    env = os.environ if env is None else env
    wanted = comp.instance.get("gpus", [])
    visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    if not wanted:
        return []
    if max(wanted) >= len(visible):
        raise SystemExit(
            f"slurmrl: {comp.name}: plan wants GPU positions {wanted} but the step sees {visible or 'no GPUs'}"
        )
    chosen = [visible[p] for p in wanted]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    return chosen


def ready_file(comp: Component, env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    attempt = env.get("SLURMRL_ATTEMPT", "0")
    return comp.run_dir / "ready" / f"attempt-{attempt}" / f"{comp.name}.{comp.rank}"


def mark_ready(comp: Component, detail: str = "") -> None:
    path = ready_file(comp)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{socket.gethostname()} {detail}\n")


def config_arg(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", required=True, help="components/<name>.toml in the run dir")
    return ap.parse_args()
