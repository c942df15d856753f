"""Topology requests per het group: ``slurm.switches`` (``--switches=COUNT[@MAX-WAIT]``),
``slurm.segment`` (``--segment=N``), and ``slurm.nvlink_domain`` (checked by the preflight, see
``slurmrl.slurm.topology``). Keys are het group names as ``slurmrl plan`` lists them."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan.model import Directive
from slurmrl.recipe.recipe import Recipe


def check(r: Recipe, groups: dict[str, int]) -> None:
    """``groups``: het group name -> nodes."""
    s = r.slurm
    for field, names in (("switches", s.switches), ("segment", s.segment), ("nvlink_domain", s.nvlink_domain)):
        for name in names:
            if name not in groups:
                raise UserError(f"slurm.{field}.{name}" if field != "nvlink_domain" else "slurm.nvlink_domain",
                                f"no het group named {name!r}; this job's groups: {', '.join(groups)}")
    for name, size in s.segment.items():
        nodes = groups[name]
        if nodes % size:
            raise UserError(f"slurm.segment.{name}", f"{nodes} node(s) in group {name!r} do not split into "
                            f"segments of {size}; use a divisor of {nodes}")


def directives(r: Recipe, group: str) -> tuple[Directive, ...]:
    s = r.slurm
    out = []
    if group in s.switches:
        out.append(Directive(option="--switches", value=s.switches[group],
                             comment="slurm.switches: at most this many leaf switches (@ how long to wait for them)"))
    if group in s.segment:
        out.append(Directive(option="--segment", value=str(s.segment[group]),
                             comment="slurm.segment: nodes in blocks of this size (topology/block)"))
    return tuple(out)
