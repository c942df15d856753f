"""Topology on the cluster: what its Slurm supports, and NVLink domains.

- ``support()``: sbatch's version and whether it has ``--switches`` and ``--segment`` (read from
  ``sbatch --help``; ``--segment`` came with Slurm 24.11's topology/block). ``refuse_unsupported``
  stops a submit whose job.sbatch asks for an option this sbatch lacks, naming the recipe field;
  the preflight prints the support line.
- ``fabric(text)``: the NVLink fabric of each GPU from ``nvidia-smi -q`` (its ``Fabric`` block:
  State, Status, CliqueId, ClusterUUID). GPUs share an NVLink domain when their fabric registration
  completed with the same (ClusterUUID, CliqueId); a zero or N/A ClusterUUID means none (an H100
  node reports State Completed with a zero UUID: that is not a domain). The probe records it on
  each node where nvidia-smi exists; ``check_domains`` compares the nodes of each het group named in
  ``slurm.nvlink_domain``. The parsing is tested with recorded output; it is not verified on real
  GB200 hardware here.

Standard library only (the probe imports ``fabric``/``node_fabric`` inside job steps).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from slurmrl.errors import UserError
from slurmrl.slurm import tools

OPTIONS = ("--switches", "--segment")
FIELDS = {"--switches": "slurm.switches", "--segment": "slurm.segment"}
ZERO_UUID = re.compile(r"^[0-]+$")


# ---- what sbatch supports -------------------------------------------------------------------
@dataclass(frozen=True)
class Support:
    version: str
    options: dict[str, bool]

    def line(self) -> str:
        have = ", ".join(f"{o} {'yes' if ok else 'no'}" for o, ok in self.options.items())
        return f"topology: sbatch {self.version}: {have}"


def parse_support(help_text: str, version_text: str) -> Support:
    words = set(re.findall(r"--[a-z][a-z-]*", help_text))
    version = (version_text.split() or ["?"])[-1]
    return Support(version=version, options={o: o in words for o in OPTIONS})


def support() -> Support:
    return parse_support(tools.out(["sbatch", "--help"]), tools.call(["sbatch", "--version"], check=False).stdout)


def asked(script_text: str) -> list[str]:
    """Topology options the script's #SBATCH lines use."""
    found = []
    for line in script_text.splitlines():
        m = re.match(r"#SBATCH\s+(--[a-z-]+)", line)
        if m and m.group(1) in OPTIONS and m.group(1) not in found:
            found.append(m.group(1))
    return found


def refuse_unsupported(script_text: str, have: Support | None = None) -> None:
    """A UserError naming the recipe field when the script asks for an option this sbatch lacks."""
    want = asked(script_text)
    if not want:
        return
    have = have or support()
    for option in want:
        if not have.options.get(option):
            raise UserError(FIELDS[option], f"this cluster's sbatch (Slurm {have.version}) has no {option} option "
                            f"({'Slurm 24.11 or newer with topology/block' if option == '--segment' else 'a topology plugin'}); "
                            "remove it from the recipe (or the #SBATCH line from job.sbatch)")


# ---- NVLink domains -------------------------------------------------------------------------
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
    gpu, values = None, {}
    inside = None  # (the Fabric header's indent, its keys' indent or None) while in the block

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


def node_fabric(timeout: float = 30) -> dict | None:
    """This node's GPUs' fabric ({"gpus": [...], "domains": [...]}) from nvidia-smi, or None without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"nvidia-smi -q: {e}"}
    if r.returncode != 0:
        return {"error": f"nvidia-smi -q exited with {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"}
    gpus = fabric(r.stdout)
    return {"gpus": [g.__dict__ for g in gpus], "domains": sorted({g.domain or "none" for g in gpus})}


def check_domains(groups: dict[str, dict[str, dict | None]]) -> list[str]:
    """``groups``: het group name -> host -> that host's node_fabric() (None: no nvidia-smi there).
    Problems: a group whose hosts are not all in one NVLink domain. Hosts without nvidia-smi are
    not judged (said once per group)."""
    problems = []
    for name, hosts in groups.items():
        seen = {h: f for h, f in hosts.items() if f is not None}
        if not seen:
            continue
        bad = {h: f["error"] for h, f in seen.items() if "error" in f}
        if bad:
            problems += [f"slurm.nvlink_domain: {name}: {h}: {e}" for h, e in sorted(bad.items())]
            continue
        domains = {h: f["domains"] for h, f in seen.items()}
        split = {h: d for h, d in domains.items() if len(d) != 1 or d == ["none"]}
        if split:
            problems += [f"slurm.nvlink_domain: {name}: {h} is in no single NVLink domain ({', '.join(d) or 'no GPUs'})"
                         for h, d in sorted(split.items())]
            continue
        distinct = {d[0] for d in domains.values()}
        if len(distinct) > 1:
            by = ", ".join(f"{h}: {d[0]}" for h, d in sorted(domains.items()))
            problems.append(f"slurm.nvlink_domain: {name}: its nodes are in {len(distinct)} NVLink domains ({by})")
    return problems


def nvlink_report(plan, reports: dict) -> tuple[list[str], list[str]]:
    """(notes, problems) for the het groups in ``plan.nvlink_domain``, from the probes' reports."""
    groups: dict[str, dict] = {}
    for c in plan.components:
        if c.group not in plan.nvlink_domain:
            continue
        hosts = groups.setdefault(plan.groups[c.group].name, {})
        for inst in c.instances:
            rep = reports.get((c.name, inst.rank))
            if rep is not None:
                hosts[rep.get("host", "?")] = rep.get("fabric") or hosts.get(rep.get("host", "?"))
    notes = []
    for name, hosts in groups.items():
        if all(f is None for f in hosts.values()):
            notes.append(f"topology: slurm.nvlink_domain {name}: no nvidia-smi on its nodes; not checked")
        else:
            domains = sorted({d for f in hosts.values() if f and "domains" in f for d in f["domains"]})
            notes.append(f"topology: slurm.nvlink_domain {name}: {len(hosts)} node(s), domain(s) {', '.join(domains)}")
    return notes, check_domains(groups)
