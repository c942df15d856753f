"""Topology on the cluster: what its Slurm supports, and NVLink domains.

- ``support()``: sbatch's version and whether it has ``--switches`` and ``--segment`` (read from
  ``sbatch --help``; ``--segment`` came with Slurm 24.11's topology/block). ``refuse_unsupported``
  stops a submit whose job.sbatch asks for an option this sbatch lacks, naming the recipe field;
  the preflight prints the support line.
- NVLink domains: the probe records each node's GPU fabric (``slurmrl.runtime.steps.fabric``, from
  ``nvidia-smi -q``) where nvidia-smi exists; ``check_domains`` compares the nodes of each het group
  named in ``slurm.nvlink_domain``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurmrl.contract.probe_report import NodeFabric, ProbeReport
from slurmrl.errors import UserError
from slurmrl.slurm import tools

OPTIONS = ("--switches", "--segment")
FIELDS = {"--switches": "slurm.switches", "--segment": "slurm.segment"}


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


# ---- NVLink domains (each node's fabric: slurmrl.runtime.steps.fabric, recorded by the probe) ---
def check_domains(groups: dict[str, dict[str, NodeFabric | None]]) -> list[str]:
    """``groups``: het group name -> host -> that host's node_fabric() (None: no nvidia-smi there).
    Problems: a group whose hosts are not all in one NVLink domain. Hosts without nvidia-smi are
    not judged (said once per group)."""
    problems = []
    for name, hosts in groups.items():
        seen = {h: f for h, f in hosts.items() if f is not None}
        if not seen:
            continue
        bad = {h: f.error for h, f in seen.items() if f.error is not None}
        if bad:
            problems += [f"slurm.nvlink_domain: {name}: {h}: {e}" for h, e in sorted(bad.items())]
            continue
        domains = {h: f.domains for h, f in seen.items()}
        split = {h: d for h, d in domains.items() if len(d) != 1 or d == ("none",)}
        if split:
            problems += [f"slurm.nvlink_domain: {name}: {h} is in no single NVLink domain ({', '.join(d) or 'no GPUs'})"
                         for h, d in sorted(split.items())]
            continue
        distinct = {d[0] for d in domains.values()}
        if len(distinct) > 1:
            by = ", ".join(f"{h}: {d[0]}" for h, d in sorted(domains.items()))
            problems.append(f"slurm.nvlink_domain: {name}: its nodes are in {len(distinct)} NVLink domains ({by})")
    return problems


def nvlink_report(plan, reports: dict[tuple[str, int], ProbeReport]) -> tuple[list[str], list[str]]:
    """(notes, problems) for the het groups in ``plan.nvlink_domain``, from the probes' reports
    (by component and rank)."""
    groups: dict[str, dict[str, NodeFabric | None]] = {}
    for c in plan.components:
        if c.group not in plan.nvlink_domain:
            continue
        hosts = groups.setdefault(plan.groups[c.group].name, {})
        for inst in c.instances:
            rep = reports.get((c.name, inst.rank))
            if rep is not None:
                hosts[rep.host] = rep.fabric or hosts.get(rep.host)
    notes = []
    for name, hosts in groups.items():
        if all(f is None for f in hosts.values()):
            notes.append(f"topology: slurm.nvlink_domain {name}: no nvidia-smi on its nodes; not checked")
        else:
            domains = sorted({d for f in hosts.values() if f is not None for d in f.domains})
            notes.append(f"topology: slurm.nvlink_domain {name}: {len(hosts)} node(s), domain(s) {', '.join(domains)}")
    return notes, check_domains(groups)
