"""`slurmrl submit --preflight`: run the probe in every component's exact srun layout, then check
each probe's report (RUN_DIR/preflight/<component>.<rank>.json) against plan.json."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.plan import Plan
from slurmrl.slurm import jobs, tools
from slurmrl.slurm.status import failed_reason
from slurmrl.slurm.watch import Snapshot, Watch
from slurmrl.summary import table


HOSTS_WAIT_S = 15.0  # how long to wait for sacct to list a group's nodes after the job ended


@dataclass
class Row:
    component: str
    rank: int
    host: str = "-"
    gpus: str = "-"
    ports: str = "-"
    container: str = "-"
    problems: list[str] = field(default_factory=list)

    @property
    def result(self) -> str:
        return "ok" if not self.problems else "FAIL: " + "; ".join(self.problems)


class GroupHosts:
    """Hostnames of each het group, in the order the script sees them, remembered over snapshots.

    One snapshot is not enough: right after a het job ends, sacct may list a component's
    ``<id>+<g>`` row with ``None assigned`` (or not at all yet) while squeue's ``%N`` for it is
    already empty (it shrinks as nodes finish); CI saw "group 1 has 0 node(s)" from that.
    So every snapshot taken while watching adds what it knows; the longest list seen per group wins
    (sacct's NodeList is the whole allocation). A group still missing at the end takes the node
    list the probes' steps were given (``add_reports``), else ``complete`` asks sacct again."""

    def __init__(self) -> None:
        self.nodes: dict[int, str] = {}
        self.hosts: dict[int, list[str]] = {}

    def add(self, snap: Snapshot) -> None:
        for p in snap.parts:
            if not p.nodes or p.nodes in ("None assigned", "(null)") or p.nodes == self.nodes.get(p.group):
                continue
            names = tools.hostnames(p.nodes)
            if len(names) > len(self.hosts.get(p.group, [])):
                self.nodes[p.group], self.hosts[p.group] = p.nodes, names

    def add_reports(self, reports: dict[tuple[str, int], dict]) -> None:
        """Groups sacct has not listed: the node lists Slurm gave the probes' steps
        (``SLURM_JOB_NODELIST_HET_GROUP_<g>``; also what a cluster without accounting leaves us)."""
        for rep in reports.values():
            for group, nodes in (rep.get("allocation") or {}).items():
                if str(group).isdigit() and int(group) not in self.hosts and isinstance(nodes, str):
                    if names := tools.hostnames(nodes):
                        self.nodes[int(group)], self.hosts[int(group)] = nodes, names

    def complete(self, watch: Watch, groups: int, wait_s: float = HOSTS_WAIT_S) -> dict[int, list[str]]:
        """Snapshots until every group ``0..groups-1`` has hosts (accounting catching up) or ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while any(g not in self.hosts for g in range(groups)) and time.monotonic() < deadline:
            self.add(watch.snapshot())
            if any(g not in self.hosts for g in range(groups)):
                time.sleep(1.0)
        return self.hosts


def expected_container(flags: tuple[str, ...]) -> dict[str, str]:
    """Pyxis flags -> what the Pyxis test double exports in the step (PYXIS_DOUBLE_<OPTION>)."""
    out = {}
    for flag in flags:
        opt, eq, value = flag.removeprefix("--").partition("=")
        out["PYXIS_DOUBLE_" + opt.replace("-", "_").upper()] = value if eq else "1"
    return out


def read_reports(run_dir: Path) -> dict[tuple[str, int], dict]:
    reports = {}
    for f in sorted((run_dir / "preflight").glob("*.json")):
        try:
            r = json.loads(f.read_text())
            reports[(r["component"], int(r["rank"]))] = r
        except (ValueError, KeyError, TypeError):
            reports[("?", -1)] = {"errors": [f"{f.name}: unreadable report"]}
    return reports


def check(run_dir: Path, plan: Plan, job_id: str, hosts: dict[int, list[str]]) -> list[Row]:
    reports = read_reports(run_dir)
    rows = []
    want_container = expected_container(plan.container_flags)
    for c in plan.components:
        for inst in c.instances:
            row = Row(c.name, inst.rank)
            rows.append(row)
            rep = reports.get((c.name, inst.rank))
            if rep is None:
                row.problems.append(f"no report (see logs/attempt-*/{c.name}.{inst.rank}.log)")
                continue
            env = rep.get("env", {})
            if str(env.get("SLURM_JOB_ID")) != str(job_id):
                row.problems.append(f"report is from job {env.get('SLURM_JOB_ID')}, not {job_id}")
            row.problems += [str(e) for e in rep.get("errors", [])]
            # host: the planned node of the component's het group
            row.host = rep.get("host", "?")
            group = hosts.get(c.group, [])
            index = c.first_node + inst.node
            if index >= len(group):
                row.problems.append(f"group {c.group} has {len(group)} node(s); planned node index {index}")
            elif row.host != group[index]:
                row.problems.append(f"runs on {row.host}, planned {group[index]} (group {c.group} node {index})")
            # GPUs: as many as the plan's positions, at those positions
            got = rep.get("gpus", [])
            row.gpus = ",".join(map(str, got)) or "-"
            if len(got) != len(inst.gpus) or list(rep.get("gpu_positions", [])) != list(inst.gpus):
                row.problems.append(f"sees {len(got)} GPU(s) {got}, plan has positions {list(inst.gpus)}")
            # ports: PORT_BASE + the plan's offsets
            base = env.get("SLURMRL_PORT_BASE")
            ports = {k: int(v) for k, v in rep.get("ports", {}).items()}
            row.ports = " ".join(f"{k}={v}" for k, v in sorted(ports.items())) or "-"
            if base is None or (plan.port_base is not None and int(base) != plan.port_base):
                row.problems.append(f"PORT_BASE is {base}, plan {plan.port_base or 'derives it from the job id'}")
            else:
                want = {purpose: int(base) + plan.ports[name] for purpose, name in inst.ports.items()}
                if want != ports:
                    row.problems.append(f"ports {ports}, plan {want}")
            # container flags reach the step
            seen = {k: v for k, v in rep.get("container", {}).items() if k.startswith("PYXIS_DOUBLE_")}
            row.container = ",".join(k.removeprefix("PYXIS_DOUBLE_CONTAINER_").lower() for k in sorted(seen)) or "-"
            if want_container and not rep.get("container"):
                row.problems.append("container flags missing: no PYXIS_*/ENROOT_* in the step environment")
            elif seen and seen != want_container:
                missing = sorted(set(want_container.items()) - set(seen.items()))
                extra = sorted(set(seen.items()) - set(want_container.items()))
                row.problems.append(f"container flags differ: missing {dict(missing)}, unexpected {dict(extra)}")
    return rows


def report_table(rows: list[Row]) -> str:
    cells = [["component", "rank", "host", "GPUs", "ports", "container", "result"]]
    cells += [[r.component, str(r.rank), r.host, r.gpus, r.ports, r.container, r.result] for r in rows]
    return "\n".join(table(cells))


def wait_and_check(run_dir: Path, job_id: str, timeout_s: float) -> int:
    plan = jobs.load_plan(run_dir)
    if plan is None:
        raise UserError(str(run_dir), "has no plan.json")
    total = sum(len(c.instances) for c in plan.components)
    started = time.monotonic()

    def progress(snap: Snapshot) -> None:  # one line per state
        where = " on " + ",".join(p.nodes for p in snap.parts if p.nodes) if snap.state == "RUNNING" else ""
        reason = "".join(f" ({p.reason})" for p in snap.parts[:1] if p.reason and snap.state == "PENDING")
        got = len(list((run_dir / "preflight").glob("*.json")))
        print(f"  {time.monotonic() - started:4.0f}s  job {job_id} {snap.state}{reason}{where}, "
              f"{got}/{total} probes reported", flush=True)

    watch = Watch(job_id)
    hosts = GroupHosts()
    last_state = None
    for snap in watch.follow(timeout_s):
        hosts.add(snap)
        if snap.state != last_state:
            progress(snap)
            last_state = snap.state
    if not snap.done:
        tools.call(["scancel", job_id], check=False)
        print(f"slurmrl: preflight job {job_id} still {snap.state} after {timeout_s:.0f}s; cancelled it")
    hosts.add_reports(read_reports(run_dir))
    rows = check(run_dir, plan, job_id, hosts.complete(watch, len(plan.groups)))
    print(report_table(rows))
    bad = [r for r in rows if r.problems]
    attempt = (jobs.attempts(run_dir) or [0])[-1]
    reason = failed_reason(run_dir, attempt)
    if snap.state != "COMPLETED":
        print(f"preflight FAILED: job {job_id} ended {snap.state}" + (f": {reason}" if reason else ""))
    for r in bad:
        print(f"preflight FAILED: {r.component}.{r.rank}: {'; '.join(r.problems)}")
    if bad or snap.state != "COMPLETED":
        return 1
    print(f"preflight ok: {len(rows)} probe(s) in {len(plan.groups)} het group(s) match plan.json")
    return 0
