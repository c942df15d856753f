"""Does each het group fit the cluster? Checked before sbatch, because `sbatch --test-only` does
not check het jobs (22.05 answers yes even to impossible ones) and a job that can never start
only pends forever."""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurmrl.errors import UserError
from slurmrl.slurm import tools
from slurmrl.slurm.script import GroupRequest

UNUSABLE = ("DOWN", "DRAIN", "FAIL", "INVAL", "FUTURE", "NOT_RESPONDING", "MAINT")


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    gpus: int
    state: str
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return not self.state.endswith("*") and not any(word in self.state.upper() for word in UNUSABLE)


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:.]*)=(\S*)", line))


def gres_gpus(gres: str) -> int:
    """``gpu:4``, ``gpu:a100:8(S:0-1)``, ``gpu:a100:4,gpu:v100:2`` -> GPU count."""
    return sum(int(n) for n in re.findall(r"(?:^|,)gpu(?::[\w.-]+)?:(\d+)", gres))


def cluster_nodes() -> list[Node]:
    nodes = []
    for line in tools.out(["scontrol", "show", "node", "-o"]).splitlines():
        f = _fields(line)
        if "NodeName" not in f:
            continue
        cpus = f.get("CPUEfctv") or f.get("CPUTot") or "0"
        nodes.append(Node(
            name=f["NodeName"], cpus=int(cpus) if cpus.isdigit() else 0, gpus=gres_gpus(f.get("Gres", "")),
            state=f.get("State", "UNKNOWN"), partitions=tuple(p for p in f.get("Partitions", "").split(",") if p),
        ))
    return nodes


def partitions() -> dict[str, dict[str, str]]:
    out = {}
    for line in tools.out(["scontrol", "show", "partition", "-o"]).splitlines():
        f = _fields(line)
        if "PartitionName" in f:
            out[f["PartitionName"]] = f
    return out


def check(groups: list[GroupRequest], names: list[str] | None = None) -> None:
    """Raise a one-line UserError naming the first group the cluster cannot hold."""
    parts = partitions()
    default = next((p for p, f in parts.items() if f.get("Default") == "YES"), None)
    nodes = cluster_nodes()
    for g in groups:
        label = f"group {g.index}" + (f" ({names[g.index]})" if names and g.index < len(names) else "")
        partition = g.partition or default
        if partition is None:
            raise UserError(label, f"sets no --partition and the cluster has no default partition; "
                                   f"partitions: {', '.join(parts) or 'none'}")
        for p in partition.split(","):
            if p not in parts:
                raise UserError(label, f"partition {p!r} does not exist on this cluster; "
                                       f"partitions: {', '.join(parts) or 'none'}")
        wanted = partition.split(",")
        fit = [n for n in nodes if n.usable and set(n.partitions) & set(wanted)
               and n.gpus >= g.gpus_per_node and n.cpus >= g.cpus_per_node]
        if len(fit) < g.nodes:
            gpus = f" with {g.gpus_per_node} GPU{'s' if g.gpus_per_node != 1 else ''} and" if g.gpus_per_node else " with"
            raise UserError(
                label,
                f"needs {g.nodes} node{'s' if g.nodes != 1 else ''}{gpus} {g.cpus_per_node} CPUs in partition "
                f"{partition!r}; the cluster has {len(fit)}",
            )
