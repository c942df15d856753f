"""The human summary `slurmrl plan` prints: what runs where, checkable in ten seconds."""

from __future__ import annotations

from pathlib import Path

from slurmrl import ports
from slurmrl.plan.model import Component, Plan
from slurmrl.render.quoting import shq
from slurmrl.settings.trainer import TrainerSettings


def table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _span(first: int, count: int) -> str:
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def gpu_map(plan: Plan) -> list[str]:
    """One row per run of identical nodes: each GPU position shows the component(s) owning it
    (``inference.1`` is the second server on that node)."""
    lines = []
    for g in plan.groups:
        if not g.gpus_per_node:
            continue
        owners: dict[tuple[int, int], list[str]] = {}  # (node, GPU) -> owners, in component order
        for c in plan.components:
            if c.group != g.index:
                continue
            for i in c.instances:
                span = c.health.nodes_per_server if c.health else 1
                if span > 1 and c.nodes > span:  # several multi-node workers: name the worker
                    owner = f"{c.name}.w{i.node // span}"
                else:
                    owner = f"{c.name}.{i.local}" if c.tasks_per_node > 1 and not c.mpi else c.name
                for gpu in i.gpus:
                    cell = owners.setdefault((c.first_node + i.node, gpu), [])
                    if owner not in cell:  # the MPI ranks of one worker share its GPUs
                        cell.append(owner)
        rows = [
            tuple("+".join(owners.get((node, gpu), ())) or "-" for gpu in range(g.gpus_per_node))
            for node in range(g.nodes)
        ]
        start = 0
        for node in range(1, g.nodes + 1):
            if node == g.nodes or rows[node] != rows[start]:
                label = f"group {g.index} {g.name} node {_span(start, node - start)}"
                lines.append(f"  {label}: " + " ".join(f"{i}:{cell}" for i, cell in enumerate(rows[start])))
                start = node
    return lines


def _compress(lines: list[str], limit: int = 12) -> list[str]:
    if len(lines) <= limit:
        return lines
    return lines[: limit // 2] + [f"  ... {len(lines) - limit} more rows ..."] + lines[-limit // 2:]


def _ready(c: Component) -> str:
    h = c.health
    if h is None:
        return "-"
    if h.first_node_only or c.nodes in (1, h.nodes_per_server):
        where = "first node"
    elif h.nodes_per_server > 1:
        where = f"first node of each {h.nodes_per_server}-node worker"
    else:
        where = f"each of {c.nodes} nodes"
    names = ",".join(h.ports)
    serving = c.task.supervisor
    extra = (" + its workers + a completion" if "--ready-workers" in serving else
             " + a completion" if "--ready-completion" in serving else "")  # slurmrl.plan.serving
    return f"{h.kind.upper()} {h.path + ' ' if h.kind == 'http' else ''}on {names} ({where}){extra}"


def summary(plan: Plan, run_dir: Path, job_id: int | None = None) -> str:
    out = [f"{plan.name}  (kind {plan.kind}, job name {plan.job_name})", f"run dir: {run_dir}", ""]
    out.append("Het groups" if len(plan.groups) > 1 else "Allocation (one group: a plain job)")
    rows = [["#", "name", "nodes", "GPUs/node", "CPUs/node", "components"]]
    rows += [[str(g.index), g.name, str(g.nodes), str(g.gpus_per_node), str(g.cpus_per_node), ", ".join(g.roles)]
             for g in plan.groups]
    out += table(rows)
    gm = gpu_map(plan)
    if gm:
        out += ["", "GPU map (GPU position: owner)"] + _compress(gm)
    out += ["", "Components, in start order"]
    rows = [["stage", "component", "group", "nodes", "tasks/node", "GPUs/task", "CPUs/task", "ready when"]]
    for i, s in enumerate(plan.stages, 1):
        for name in s.components:
            c = plan.component(name)
            rows.append([
                str(i), c.name, str(c.group), _span(c.first_node, c.nodes), str(c.tasks_per_node),
                str(len(c.instances[0].gpus)), str(c.cpus_per_task), _ready(c),
            ])
    out += table(rows)
    if plan.port_base:
        base_line = f"PORT_BASE = {plan.port_base} (fixed)"
        base = plan.port_base
    else:
        shown = job_id if job_id is not None else 1234
        base = ports.base_for_job(shown)
        base_line = (f"PORT_BASE = {ports.base_expr()} unless taken on a node or inside its ephemeral range; "
                     f"for job {shown}: {base}")
    out += ["", f"Ports ({base_line})"]
    out += table([[name, f"+{off}", str(base + off)] for name, off in plan.ports.items()])
    if plan.services:
        out += ["", "Head-node services: " + ", ".join(
            f"{n} (group {plan.component(n).group}, node {plan.component(n).first_node})" for n in plan.services)]
    trainer = next((c.settings for c in plan.components if isinstance(c.settings, TrainerSettings)), None)
    if trainer is not None:  # the mesh as plan resolved it, read from the trainer's typed settings
        out += ["", trainer.parallel.describe()]
    main = [c.name for c in plan.components if c.main]
    out += ["", f"Done when: {', '.join(main)} exit 0. Any failure stops the job after a {plan.grace_seconds}s grace."]
    for w in plan.warnings:
        out.append(f"warning: {w}")
    return "\n".join(out)


def salloc_line(plan: Plan, script=None) -> str:
    """The salloc that gives the same allocation, het groups separated by ' : '; with ``script``,
    the command salloc runs inside it: ``bash SCRIPT`` (the user is one step from running)."""
    parts = []
    for g in plan.groups:
        opts = [
            f"{d.option}={d.value}" if d.value is not None else d.option
            for d in g.directives
            if d.option not in ("--output", "--open-mode", "--requeue", "--no-requeue", "--signal")
        ]
        parts.append(" ".join(shq(o) for o in opts))
    line = "salloc " + " : ".join(parts)
    return f"{line} bash {shq(str(script))}" if script is not None else line
