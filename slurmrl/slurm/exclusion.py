"""Nodes kept out of a job: each het component's ``ExcNodeList`` gets the nodes added (Slurm keeps it
over every requeue), its own exclusions (``#SBATCH --exclude``) kept. ``submit`` sends a run dir that
excluded nodes held (``sbatch --hold``), adds them, then releases it: no component can start on one."""

from __future__ import annotations

import re

from slurmrl.slurm import tools

FIELD = re.compile(r"(?:^| )(JobId|ExcNodeList)=(\S*)")


def components(job_id: str) -> list[tuple[str, str]]:
    """(component job id, its ExcNodeList or '') per het component (one for a plain job)."""
    out = []
    for line in tools.out(["scontrol", "-o", "show", "job", job_id]).splitlines():
        fields = dict(FIELD.findall(line))
        if fields.get("JobId"):
            exc = fields.get("ExcNodeList", "")
            out.append((fields["JobId"], "" if exc == "(null)" else exc))
    return out


def exclude(job_id: str, nodes: list[str]) -> None:
    """Add ``nodes`` to every component's ExcNodeList (a UserError in Slurm's words when it refuses)."""
    for component, exc in components(job_id):
        listed = [exc] if exc else []
        tools.call(["scontrol", "update", f"JobId={component}", "ExcNodeList=" + ",".join([*listed, *nodes])])


def release(job_id: str) -> None:
    tools.call(["scontrol", "release", job_id])
