"""`slurmrl status`: the typed report of a job (``status_report.StatusReport``) built from what Slurm says
(``slurm.watch.Snapshot``) and what the run dir holds: the attempt, each plan component's step, readiness,
dead tasks and restarts, where the job serves, the phases, the latest training rows, the benchmark."""

from __future__ import annotations

import shlex
from pathlib import Path

from slurmrl.app import status_events, status_joiners, status_nodes
from slurmrl.app.job_outputs import failed_reason, last_record, read_benchmark
from slurmrl.app.status_report import (
    ComponentStatus,
    DeadTask,
    Endpoint,
    PartStatus,
    Phase,
    ReportPage,
    Serving,
    StatusReport,
)
from slurmrl.contract.argv import AUTH_MIDDLEWARE
from slurmrl.plan import Plan
from slurmrl.rundir import ended
from slurmrl.rundir.links import read_links
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.steps.attempts import requeues_used
from slurmrl.slurm import tools
from slurmrl.slurm.watch import Snapshot

FRONT_ROLES = ("router", "dynamo-frontend")  # what clients talk to when the job has one (else: each server)
SERVER_ROLES = ("inference", "dynamo-worker")  # OpenAI-compatible servers, and Dynamo's workers
MODEL_FLAGS = ("--served-model-name", "--model-name")  # the name workers serve under (Dynamo's mocker: the second)
Ends = dict[tuple[str, int], ended.Ended]


def ready_ranks(run_dir: Path, attempt: int, name: str, gone: Ends | None = None) -> list[int]:
    """Tasks of ``name`` that passed their readiness check and whose command has not ended since."""
    return [t for t in RunDir(run_dir).ready_tasks(attempt, name) if (name, t) not in (gone or {})]


def ends(run_dir: Path, attempt: int) -> Ends:
    """(component, task) -> how its command ended (slurmrl.rundir.ended), for the tasks that have."""
    return ended.read_all(RunDir(run_dir).ended_dir(attempt))


def dead_tasks(name: str, gone: Ends) -> list[DeadTask]:
    """The tasks of ``name`` that failed (a server that ended on its own is dead, whatever its code)."""
    return [DeadTask(task, e.code, e.cause or f"exited with code {e.code}")
            for (n, task), e in sorted(gone.items()) if n == name and e.failed]


# What Slurm's state says about a job the script saw end with SIGTERM (its STOPPED file).
STOP_CAUSES = {
    "CANCELLED": "cancelled (scancel / slurmrl cancel)",
    "TIMEOUT": "the time limit",
    "PREEMPTED": "preempted",
    "REQUEUED": "requeued",
    "PENDING": "requeued",
    "NODE_FAIL": "a node failed",
    "DEADLINE": "its deadline",
}


def stopped_reason(run_dir: Path, attempt: int, state: str) -> str | None:
    """Why an attempt the script did not end itself stopped: Slurm ended it (STOPPED), or the
    warning signal's planned stop (PREEMPTED); None when neither."""
    paths = RunDir(run_dir)
    for name, path in ((RunDir.PREEMPTED, paths.preempted_file(attempt)), (RunDir.STOPPED, paths.stopped_file(attempt))):
        text = read_note(path)
        if text is None:
            continue
        if name == RunDir.STOPPED and state in STOP_CAUSES:
            return f"{STOP_CAUSES[state]}; components stopped in order by the script"
        return text
    return None


def endpoints(run_dir: Path, attempt: int, plan: Plan, gone: Ends | None = None) -> list[Endpoint]:
    """Every ready task of the attempt that serves a URL (its ready file's first line), in plan order;
    a task whose command has ended (``gone``: its end record) serves no more and is left out."""
    out = []
    for c in plan.components:
        for task, f in RunDir(run_dir).ready_tasks(attempt, c.name).items():
            if (c.name, task) in (gone or {}):
                continue
            url = read_ready(f).url
            if url:
                out.append(Endpoint(c.name, task, url))
    return out


def serving(plan: Plan, eps: list[Endpoint]) -> Serving:
    """Where clients talk to the job (``Serving``): the router's URL when the plan has one, else each server's."""
    for front, roles in ((True, FRONT_ROLES), (False, SERVER_ROLES)):
        names = [c.name for c in plan.components if c.role in roles]
        if names:
            urls = [e.url for e in eps if e.component in names]
            return Serving(urls[0] if urls else None, urls, names, front)
    return Serving()


def served_model(run_dir: Path, plan: Plan) -> str | None:
    """The name the servers answer to: ``--served-model-name`` in job.sbatch (the script is the
    truth, hand edits included), else in the plan's server command lines."""
    script = read_text(RunDir(run_dir).script, missing="")
    for line in script.splitlines():
        if any(flag in line for flag in MODEL_FLAGS):
            try:
                words = shlex.split(line.rstrip().removesuffix("\\"), comments=True)
            except ValueError:
                continue
            for i, w in enumerate(words):
                if w in MODEL_FLAGS and i + 1 < len(words) and "$" not in words[i + 1]:
                    return words[i + 1]
                if w.split("=", 1)[0] in MODEL_FLAGS and "=" in w and "$" not in w:
                    return w.split("=", 1)[1]
    for c in plan.components:
        args = list(c.task.command)
        for a, value in zip(args, args[1:]):
            if a in MODEL_FLAGS and isinstance(value, str):
                return value
    return None


def secret_file(run_dir: Path) -> str | None:
    """The path of the job's secret when its servers require it (job.sbatch runs them with the
    auth middleware), else None. Never the secret itself."""
    script = read_text(RunDir(run_dir).script, missing="")
    return str(RunDir(tools.transport().place(run_dir)).secret) if AUTH_MIDDLEWARE in script else None


def torn_down(phase_list: list[Phase]) -> set[str]:
    """Components the script itself stopped (``phase "teardown: NAME..."`` in stop_all): their
    steps end CANCELLED or with a signal's exit code because the job was ending, not on their own."""
    for p in reversed(phase_list):
        if p.what.startswith("teardown: "):
            return set(p.what.removeprefix("teardown: ").split())
    return set()


def phases(run_dir: Path, attempt: int) -> list[Phase]:
    """The attempt's start-up milestones, each with seconds since the allocation (the first phase
    when the allocation is not among them)."""
    found = RunDir(run_dir).read_phases(attempt)
    if not found:
        return []
    start = next((t for t, what in found if what.startswith("allocation")), found[0][0])
    return [Phase(t, t - start, what) for t, what in found]


def report(snap: Snapshot, run_dir: Path | None, plan: Plan | None) -> StatusReport:
    names = {g.index: g.name for g in plan.groups} if plan else {}
    rep = StatusReport(snap, str(run_dir) if run_dir else None,
                       [PartStatus(p, names.get(p.group, "")) for p in snap.parts],
                       serving=serving(plan, []) if plan else None)
    if run_dir is None:
        return rep
    tools.transport().pull(run_dir)  # --cluster: what the job wrote there, brought back
    rep.cluster = tools.transport().name
    attempt = (RunDir(run_dir).attempts() or [0])[-1]
    # requeued and waiting: the attempt it waits to run has no files yet; the one before's end
    # (FAILED, phases, ready files) is not the job's current state
    waiting_for = snap.restarts if snap.restarts is not None and snap.restarts > attempt else None
    attempt = attempt if waiting_for is None else waiting_for
    rep.attempt = attempt
    rep.attempt_waiting = waiting_for is not None
    rep.max_requeues = plan.max_requeues if plan is not None and plan.requeue else None
    rep.requeues_used = requeues_used(run_dir, attempt)  # the warning signal's and node faults'
    rep.failed = failed_reason(run_dir, attempt)
    rep.stopped = stopped_reason(run_dir, attempt, snap.state)
    rep.phases = phases(run_dir, attempt)
    rep.benchmark = read_benchmark(run_dir)
    rep.links = read_links(run_dir).to_json()  # submit --again and sweeps (links.json)
    rep.training = latest_training(run_dir)
    rep.report = report_where(run_dir)
    rep.joiners = status_joiners.read(run_dir)  # servers of other jobs that joined (slurmrl.rundir.joined)
    nodes = status_nodes.node_report(run_dir, snap.job_id)  # why each attempt ended; nodes kept out
    rep.attempt_ends, rep.excluded = nodes["attempt_ends"], nodes["excluded"]
    gone = ends(run_dir, attempt)
    if plan is not None:
        rep.model = served_model(run_dir, plan) if any(c.role in SERVER_ROLES for c in plan.components) else None
        rep.secret_file = secret_file(run_dir)
        # ready files outlive the job (and a requeued job's wait in the queue): only a running
        # job serves at them
        if snap.state == "RUNNING":
            rep.endpoints = endpoints(run_dir, attempt, plan, gone)
        rep.serving = serving(plan, rep.endpoints)
    stopped_by_script = torn_down(rep.phases)
    for c in plan.components if plan else []:
        rep.components.append(ComponentStatus(
            c.name, c.group, c.main, c.critical, len(c.instances), snap.step(c.name),
            ready_ranks(run_dir, attempt, c.name, gone), dead_tasks(c.name, gone),
            torn_down=c.name in stopped_by_script,
            # every task recorded a planned stop, or Slurm stopped the whole attempt (a cancel, the time
            # limit): under load a step can be killed before its supervisor writes its record
            stopped=ended.all_stopped(gone, c.name) or bool(rep.stopped)))
    status_events.add(rep, run_dir)  # events.jsonl: deaths, restarts, joins; each component's restarts
    return rep


def latest_training(run_dir: Path) -> dict | None:
    """The newest record of metrics/orchestrator.jsonl and metrics/trainer.jsonl (None without either)."""
    found = {role: last_record(RunDir(run_dir).metrics(role)) for role in ("orchestrator", "trainer")}
    found["eval"] = last_record(RunDir(run_dir).eval_metrics)  # [eval]: the newest evaluation
    return found if any(found.values()) else None


def report_where(run_dir: Path) -> ReportPage:
    """Where `slurmrl report` writes the run's page, and whether it is there yet."""
    page = RunDir(run_dir).report_page()
    return ReportPage(str(page), page.is_file())
