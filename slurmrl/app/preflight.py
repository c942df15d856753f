"""`slurmrl submit --preflight`: run the probe in every component's exact srun layout, then check
each probe's report (RUN_DIR/preflight/<component>.<rank>.json) against plan.json."""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from slurmrl.app.job_outputs import failed_reason
from slurmrl.contract import probe_report
from slurmrl.contract.probe_report import ContainerObservation, ProbeReport
from slurmrl.contract.reader import ContractError
from slurmrl.errors import UserError
from slurmrl.plan import Plan
from slurmrl.plan.model import Component, Instance
from slurmrl.plan.stored import load_plan
from slurmrl.render.summary import table
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.paths import RunDir
from slurmrl.slurm import tools, topology
from slurmrl.slurm.watch import Snapshot, Watch

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

    def add_reports(self, reports: Reports) -> None:
        """The node lists Slurm gave the probes' steps (``SLURM_JOB_NODELIST_HET_GROUP_<g>``; also what
        a cluster without accounting leaves us), where they are longer than what the snapshots saw: a
        snapshot taken as a short job starts or ends may list only the nodes still busy."""
        for rep in reports.by_task.values():
            for group, nodes in rep.allocation.items():
                if group.isdigit():
                    names = tools.hostnames(nodes)
                    if len(names) > len(self.hosts.get(int(group), [])):
                        self.nodes[int(group)], self.hosts[int(group)] = nodes, names

    def complete(self, watch: Watch, groups: int, wait_s: float = HOSTS_WAIT_S) -> dict[int, list[str]]:
        """Snapshots until every group ``0..groups-1`` has hosts (accounting catching up) or ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while any(g not in self.hosts for g in range(groups)) and time.monotonic() < deadline:
            self.add(watch.snapshot())
            if any(g not in self.hosts for g in range(groups)):
                time.sleep(1.0)
        return self.hosts


@dataclass(frozen=True)
class Mount:
    source: str
    target: str  # as seen inside the container (Pyxis: relative targets are under the rootfs)
    flags: tuple[str, ...]


@dataclass(frozen=True)
class ContainerPlan:
    """What the plan's Pyxis flags ask for, parsed the way Pyxis parses them (its args.c)."""

    image: str | None = None
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None
    name: str | None = None
    writable: bool | None = None  # None: the site's enroot.conf decides (ENROOT_ROOTFS_WRITABLE)
    remap_root: bool | None = None
    mount_home: bool | None = None


def _inside(path: str) -> str:
    """A path as the container sees it: relative ones are under its / (enroot-mount --root)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def container_plan(flags: tuple[str, ...]) -> ContainerPlan:
    values: dict = {}
    mounts: list[Mount] = []
    for flag in flags:
        opt, _, value = flag.removeprefix("--").partition("=")
        if opt == "container-mounts":  # SRC[:DST[:FLAGS]],... ; FLAGS joined by "+"
            for entry in value.split(","):
                src, _, rest = entry.partition(":")
                dst, _, mflags = rest.partition(":")
                mounts.append(Mount(src, _inside(dst or src),
                                    tuple(f for f in mflags.split("+") if f)))
        elif opt in ("container-image", "container-workdir"):
            values[opt.removeprefix("container-")] = value
        elif opt == "container-name":
            values["name"] = value.partition(":")[0]  # NAME[:auto|create|exec|no_exec]
        for yes, no, key in (("container-writable", "container-readonly", "writable"),
                             ("container-remap-root", "no-container-remap-root", "remap_root"),
                             ("container-mount-home", "no-container-mount-home", "mount_home")):
            if opt in (yes, no):
                values[key] = opt == yes
    return ContainerPlan(mounts=tuple(mounts), **values)


def check_container(flags: tuple[str, ...], obs: ContainerObservation | None) -> tuple[str, list[str]]:
    """The probe's container observation (slurmrl.runtime.steps.container.observe) against the plan's
    Pyxis flags -> (the report's "container" cell, problems). Only what a real Pyxis + enroot step
    shows is required: enroot's /.lock, a mount at each planned destination, the workdir as cwd,
    a read-only or writable / when the plan says which, uid 0 with --container-remap-root and the
    job's uid without it, the home directory mounted with --container-mount-home, and the
    container directory pyxis_[<jobid>_]<name> with --container-name. The Pyxis test double
    (tests/support/pyxis_double) runs no image: there its marker replaces /.lock and the name is not checked."""
    want = container_plan(flags)
    double = obs is not None and bool(obs.test_double)
    inside = obs is not None and (bool(obs.enroot_lock) or double)
    if want.image is None and want.name is None:  # Pyxis runs a container for either
        if inside:
            return "container", ["runs in a container the plan does not have (PYXIS_CONTAINER_* in the environment?)"]
        return "-", []
    if obs is None or not inside:
        return "none", ["container flags missing: the step is not in an enroot container (no /.lock)"]
    planned = [m for m in want.mounts if m.source != "umount"]  # "umount" detaches DST instead
    problems = _mount_problems(planned, obs.mounts) + _process_problems(want, obs)
    if want.name and not double:
        problems += _name_problems(want.name, obs.rootfs)
    found = sum(m.target in obs.mounts for m in planned)
    root = "?" if obs.readonly_root is None else "ro" if obs.readonly_root else "rw"
    return f"{'test double' if double else 'enroot'} /:{root} mounts {found}/{len(planned)}", problems


def _mount_problems(planned: list[Mount], mounts: dict[str, str]) -> list[str]:
    """--container-mounts: something mounted at each destination, read-only where the flags say ro."""
    problems = []
    for m in planned:
        if m.target not in mounts:
            problems.append(f"nothing mounted at {m.target} (--container-mounts {m.source}:{m.target})")
        elif "ro" in m.flags and mounts[m.target] != "ro":
            problems.append(f"{m.target} is mounted {mounts[m.target]}, the plan mounts it ro")
    return problems


def _process_problems(want: ContainerPlan, obs: ContainerObservation) -> list[str]:
    """The step's working directory, its / read-only or writable, its uid and its home directory."""
    problems = []
    if want.workdir and want.workdir.startswith("/") and obs.cwd != _inside(want.workdir):
        problems.append(f"working directory is {obs.cwd}, plan has --container-workdir={want.workdir}")
    if want.writable is not None and obs.readonly_root is want.writable:
        problems.append(f"/ is {'read-only' if want.writable else 'writable'}, plan has "
                        f"{'--container-writable' if want.writable else '--container-readonly'}")
    if want.remap_root and obs.uid != 0:
        problems.append(f"uid is {obs.uid}, --container-remap-root makes it 0")
    elif want.remap_root is False and (obs.job_uid or "").isdigit() and obs.uid != int(obs.job_uid or ""):
        problems.append(f"uid is {obs.uid}, not the job's {obs.job_uid} (--no-container-remap-root)")
    home = "/root" if want.remap_root else obs.home
    if want.mount_home and home and _inside(home) not in obs.mounts:
        problems.append(f"home {home} is not mounted (--container-mount-home)")
    return problems


def _name_problems(name: str, rootfs: str | None) -> list[str]:
    """--container-name: enroot's container directory (the rootfs) is pyxis_[<jobid>_]<name>."""
    found = posixpath.basename(rootfs or "/")  # "": the rootfs is a filesystem's root
    if found and not re.fullmatch(rf"pyxis_(\d+_)?{re.escape(name)}", found):
        return [f"container directory is {found}, not pyxis_{name} (--container-name)"]
    return []


@dataclass(frozen=True)
class Reports:
    """The probes' reports by (component, rank), and each report file that could not be read
    (its name -> one line naming the file and the key)."""

    by_task: dict[tuple[str, int], ProbeReport] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)


def read_reports(run_dir: Path) -> Reports:
    reports = Reports()
    for f in RunDir(run_dir).preflight_reports():
        try:
            rep = probe_report.read(f)
        except (OSError, ContractError) as e:
            reports.unreadable[f.name] = f"unreadable report: {e}"
            continue
        reports.by_task[rep.task] = rep
    return reports


def check(run_dir: Path, plan: Plan, job_id: str, hosts: dict[int, list[str]]) -> list[Row]:
    reports = read_reports(run_dir)
    rows = []
    for c in plan.components:
        for inst in c.instances:
            rep = reports.by_task.get((c.name, inst.rank))
            if rep is not None:
                rows.append(task_row(rep, plan, c, inst, job_id, hosts.get(c.group, [])))
                continue
            why = reports.unreadable.get(RunDir(run_dir).preflight_report(c.name, inst.rank).name)
            rows.append(Row(c.name, inst.rank, problems=[
                why or f"no report (see logs/attempt-*/{c.name}.{inst.rank}.log)"]))
    return rows


def task_row(rep: ProbeReport, plan: Plan, c: Component, inst: Instance, job_id: str, group: list[str]) -> Row:
    """One probe's report against its task in the plan: the job, the host (``group``: the hosts of the
    component's het group), the GPUs, the ports and the container."""
    row = Row(c.name, inst.rank, host=rep.host, gpus=",".join(rep.gpus) or "-",
              ports=" ".join(f"{k}={v}" for k, v in sorted(rep.ports.items())) or "-")
    if rep.job_id != str(job_id):
        row.problems.append(f"report is from job {rep.job_id}, not {job_id}")
    row.problems += list(rep.errors)
    index = c.first_node + inst.node  # the planned node of the component's het group
    if index >= len(group):
        row.problems.append(f"group {c.group} has {len(group)} node(s); planned node index {index}")
    elif rep.host != group[index]:
        row.problems.append(f"runs on {rep.host}, planned {group[index]} (group {c.group} node {index})")
    if len(rep.gpus) != len(inst.gpus) or list(rep.gpu_positions) != list(inst.gpus):  # at the plan's positions
        row.problems.append(f"sees {len(rep.gpus)} GPU(s) {list(rep.gpus)}, plan has positions {list(inst.gpus)}")
    row.problems += _port_problems(rep, plan, inst)
    row.container, found = check_container(plan.container_flags, rep.container)
    row.problems += found
    return row


def _port_problems(rep: ProbeReport, plan: Plan, inst: Instance) -> list[str]:
    """The ports bound are PORT_BASE (the plan's, or the one the job derived) + the plan's offsets."""
    base = rep.port_base
    if base is None or not base.isdigit() or (plan.port_base is not None and int(base) != plan.port_base):
        return [f"PORT_BASE is {base}, plan {plan.port_base or 'derives it from the job id'}"]
    want = {purpose: int(base) + plan.ports[name] for purpose, name in inst.ports.items()}
    return [f"ports {rep.ports}, plan {want}"] if want != rep.ports else []


def report_table(rows: list[Row]) -> str:
    cells = [["component", "rank", "host", "GPUs", "ports", "container", "result"]]
    cells += [[r.component, str(r.rank), r.host, r.gpus, r.ports, r.container, r.result] for r in rows]
    return "\n".join(table(cells))


def ended_by_the_slurmrl_check(run_dir: Path, attempt: int, reason: str | None) -> bool:
    """Whether the job's FAILED ``reason`` is the last line of its first step, the check of slurmrl in
    the image (slurmrl.contract.slurmrl_check): then no probe ran."""
    said = read_note(RunDir(run_dir).slurmrl_check_log(attempt))
    return bool(reason and said and said.splitlines()[-1] == reason)


def wait_and_check(run_dir: Path, job_id: str, timeout_s: float) -> int:
    plan = load_plan(run_dir)
    if plan is None:
        raise UserError(str(run_dir), "has no plan.json")
    total = sum(len(c.instances) for c in plan.components)
    started = time.monotonic()

    def progress(snap: Snapshot) -> None:  # one line per state
        where = " on " + ",".join(p.nodes for p in snap.parts if p.nodes) if snap.state == "RUNNING" else ""
        reason = "".join(f" ({p.reason})" for p in snap.parts[:1] if p.reason and snap.state == "PENDING")
        got = len(RunDir(run_dir).preflight_reports())
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
        tools.call(["scancel", "--", job_id], check=False)
        print(f"slurmrl: preflight job {job_id} still {snap.state} after {timeout_s:.0f}s; cancelled it")
    tools.transport().pull(run_dir)  # --cluster: the probes' reports, written there
    attempt = (RunDir(run_dir).attempts() or [0])[-1]
    reason = failed_reason(run_dir, attempt)
    if ended_by_the_slurmrl_check(run_dir, attempt, reason):  # one line: no slurmrl, or another, in the image
        print(f"preflight FAILED: job {job_id} ended {snap.state}: {reason}")
        return 1
    reports = read_reports(run_dir)
    hosts.add_reports(reports)
    rows = check(run_dir, plan, job_id, hosts.complete(watch, len(plan.groups)))
    print(report_table(rows))
    bad = [r for r in rows if r.problems]
    notes, fabric_problems = topology.nvlink_report(plan, reports.by_task)
    for line in [topology.support().line(), *notes]:
        print(line)
    for problem in fabric_problems:
        print(f"preflight FAILED: {problem}")
    if snap.state != "COMPLETED":
        print(f"preflight FAILED: job {job_id} ended {snap.state}" + (f": {reason}" if reason else ""))
    for r in bad:
        print(f"preflight FAILED: {r.component}.{r.rank}: {'; '.join(r.problems)}")
    if bad or fabric_problems or snap.state != "COMPLETED":
        return 1
    print(f"preflight ok: {len(rows)} probe(s) in {len(plan.groups)} het group(s) match plan.json")
    return 0
