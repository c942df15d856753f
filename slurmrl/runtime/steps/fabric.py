"""This node's NVLink fabric, read inside a job step (the preflight probe records it).

- ``fabric(text)``: the NVLink fabric of each GPU from ``nvidia-smi -q`` (its ``Fabric`` block:
  State, Status, CliqueId, ClusterUUID). GPUs share an NVLink domain when their fabric registration
  completed with the same (ClusterUUID, CliqueId); a zero or N/A ClusterUUID means none (an H100
  node reports State Completed with a zero UUID: that is not a domain).
- ``node_fabric()``: this node's GPUs' fabric and domains (``slurmrl.contract.probe_report.NodeFabric``),
  or None without nvidia-smi.

``slurmrl.slurm.topology.check_domains`` compares what the probes recorded on the nodes of each het
group named in ``slurm.nvlink_domain``. The parsing is tested with recorded output; it is not
verified on real GB200 hardware here. Standard library only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from slurmrl.contract.probe_report import NodeFabric

ZERO_UUID = re.compile(r"^[0-]+$")


@dataclass(frozen=True)
class GpuFabric:
    gpu: str  # the GPU's bus id as nvidia-smi -q names it
    state: str
    status: str
    clique: str
    cluster_uuid: str

    @property
    def domain(self) -> str | None:
        """``ClusterUUID/CliqueId`` when the GPU is registered in an NVLink domain, else None."""
        uuid = self.cluster_uuid.strip()
        if self.state.lower() != "completed" or self.status.lower() not in ("success", ""):
            return None
        if not uuid or uuid.upper() == "N/A" or ZERO_UUID.match(uuid):
            return None
        return f"{uuid}/{self.clique}"


def fabric(text: str) -> list[GpuFabric]:
    """Each GPU's Fabric block in ``nvidia-smi -q`` output (GPUs without one are left out). Only the
    block's own keys count, not those of a section nested in it (``Health``)."""
    out: list[GpuFabric] = []
    gpu: str | None = None
    values: dict[str, str] = {}
    # (the Fabric header's indent, its keys' indent or None) while in the block
    inside: tuple[int, int | None] | None = None

    def flush():
        if gpu is not None and values:
            out.append(GpuFabric(gpu=gpu, state=values.get("state", ""), status=values.get("status", ""),
                                 clique=values.get("cliqueid", ""), cluster_uuid=values.get("clusteruuid", "")))

    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        text_ = raw.strip()
        m = re.match(r"^GPU\s+(\S+)$", text_)
        if m and indent == 0:
            flush()
            gpu, values, inside = m.group(1), {}, None
            continue
        if gpu is None:
            continue
        if inside is not None and indent <= inside[0]:
            inside = None  # left the block
        key, sep, value = text_.partition(":")
        if inside is None:
            if not sep and key.strip().lower() == "fabric":
                inside = (indent, None)
            continue
        if inside[1] is None:
            inside = (inside[0], indent)
        if sep and indent == inside[1]:
            values[key.strip().replace(" ", "").lower()] = value.strip()
    flush()
    return out


def node_fabric(timeout: float = 30) -> NodeFabric | None:
    """This node's GPUs' fabric and domains from nvidia-smi, or None without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return NodeFabric(error=f"nvidia-smi -q: {e}")
    if r.returncode != 0:
        return NodeFabric(error=f"nvidia-smi -q exited with {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}")
    return summary(fabric(r.stdout))


def summary(gpus: list[GpuFabric]) -> NodeFabric:
    """The node's fabric as the probe reports it: each GPU's block, and the domains its GPUs are in."""
    return NodeFabric(gpus=tuple(dict(g.__dict__) for g in gpus), domains=tuple(sorted({g.domain or "none" for g in gpus})))
