"""`slurmrl status`: where the job serves, its het components, per plan component its step and
readiness, the start-up phases of the current attempt, and the [benchmark] results when there are any."""

from __future__ import annotations

import re
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

from slurmrl.app import sweep_report
from slurmrl.app.cluster import on_cluster
from slurmrl.app.job_outputs import failed_reason, last_record, read_benchmark, typed
from slurmrl.app.plot import eval_line, training_line
from slurmrl.app.sweep_dir import is_sweep_dir
from slurmrl.charts import benchmark_rows, benchmark_status_line
from slurmrl.contract.metrics import OrchestratorRow, TrainerRow
from slurmrl.errors import UserError
from slurmrl.plan import Plan
from slurmrl.plan.stored import load_plan
from slurmrl.plan.vllm import AUTH_MIDDLEWARE
from slurmrl.render.summary import table
from slurmrl.rundir import ended, jobs, strict_json
from slurmrl.rundir.links import read_links
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.ready import read_ready
from slurmrl.slurm import tools
from slurmrl.slurm.watch import Snapshot, Watch

REFRESH_S = 2.0
NOT_FOUND_AFTER_S = 15.0  # sacct lags a submit by ~1 s; a job unknown for this long does not exist
FRONT_ROLES = ("router", "dynamo-frontend")  # what clients talk to when the job has one (else: each server)
SERVER_ROLES = ("inference", "dynamo-worker")  # OpenAI-compatible servers, and Dynamo's workers
MODEL_FLAGS = ("--served-model-name", "--model-name")  # the name workers serve under (Dynamo's mocker: the second)


def resolve(target: str | None) -> tuple[Path | None, str]:
    """RUN_DIR, RUN_DIR/job.sbatch, a job id, or nothing (the current directory) -> (run dir, job id)."""
    if target is not None and re.fullmatch(r"\d+", target) and not Path(target).exists():
        return find_run_dir(target), target
    run_dir = jobs.run_dir_arg(target)
    return run_dir, jobs.last_job(run_dir)


def find_run_dir(job_id: str) -> Path | None:
    """The run dir of a job the controller still knows: its batch log lives in RUN_DIR/logs/."""
    r = tools.call(["scontrol", "show", "job", job_id], check=False)
    m = re.search(r"StdOut=(\S+)", r.stdout) if r.returncode == 0 else None
    if not m:
        return None
    run_dir = Path(m.group(1)).parent.parent
    try:
        ids = [j.job_id for j in jobs.history(run_dir)]
    except UserError:
        return None
    return run_dir if job_id in ids else None


def ready_ranks(run_dir: Path, attempt: int, name: str, gone: Ends | None = None) -> list[int]:
    """Tasks of ``name`` that passed their readiness check and whose command has not ended since."""
    return [t for t in RunDir(run_dir).ready_tasks(attempt, name) if (name, t) not in (gone or {})]


Ends = dict[tuple[str, int], ended.Ended]


def ends(run_dir: Path, attempt: int) -> Ends:
    """(component, task) -> how its command ended (slurmrl.rundir.ended), for the tasks that have."""
    return ended.read_all(RunDir(run_dir).ended_dir(attempt))


def shown_state(c: dict) -> str:
    """A component's state in the table: Slurm's, but a step a planned stop ended (FAILED 15:0, CANCELLED)
    reads as stopped, never FAILED; no step yet but a ready file: it runs, sacct has not listed it yet."""
    state = (c["step"] or {}).get("state") or ("started" if c["ready"] else "not started")
    if state.split()[0] not in ("FAILED", "CANCELLED") or c.get("dead"):
        return state
    return "stopped by the script" if c.get("torn_down") else "stopped as asked" if c.get("stopped") else state


def dead_tasks(name: str, gone: Ends) -> list[dict]:
    """The tasks of ``name`` that failed (a server that ended on its own is dead, whatever its code)."""
    return [{"task": task, "code": e.code, "cause": e.cause or f"exited with code {e.code}"}
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


def own_requeues(run_dir: Path, attempt: int) -> int:
    """Requeues the job asked for itself before ``attempt`` (the warning signal's PREEMPTED note says
    so); a manual `scontrol requeue` counts a Slurm restart but uses none of slurm.max_requeues."""
    paths = RunDir(run_dir)
    return sum("requeued as attempt" in (read_note(paths.preempted_file(a)) or "") for a in range(attempt))


def endpoints(run_dir: Path, attempt: int, plan: Plan, gone: Ends | None = None) -> list[dict]:
    """Every ready task of the attempt that serves a URL (its ready file's first line), in plan order;
    a task whose command has ended (``gone``: its end record) serves no more and is left out."""
    out = []
    for c in plan.components:
        for task, f in RunDir(run_dir).ready_tasks(attempt, c.name).items():
            if (c.name, task) in (gone or {}):
                continue
            url = read_ready(f).url
            if url:
                out.append({"component": c.name, "task": task, "url": url})
    return out


def serving(plan: Plan, eps: list[dict]) -> dict:
    """Where clients talk to the job: the router's URL when the plan has one, else each server's
    (``url`` is the first; None while none is ready). ``components``: the ones that serve."""
    for front, roles in ((True, FRONT_ROLES), (False, SERVER_ROLES)):
        names = [c.name for c in plan.components if c.role in roles]
        if names:
            urls = [e["url"] for e in eps if e["component"] in names]
            return {"url": urls[0] if urls else None, "urls": urls, "components": names, "router": front}
    return {"url": None, "urls": [], "components": [], "router": False}


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


def torn_down(phase_list: list[dict]) -> set[str]:
    """Components the script itself stopped (``phase "teardown: NAME..."`` in stop_all): their
    steps end CANCELLED or with a signal's exit code because the job was ending, not on their own."""
    for p in reversed(phase_list):
        if p["what"].startswith("teardown: "):
            return set(p["what"].removeprefix("teardown: ").split())
    return set()


def phases(run_dir: Path, attempt: int) -> list[dict]:
    """The attempt's start-up milestones, each with seconds since the allocation (the first phase
    when the allocation is not among them)."""
    found = RunDir(run_dir).read_phases(attempt)
    if not found:
        return []
    start = next((t for t, what in found if what.startswith("allocation")), found[0][0])
    return [{"time": t, "since_allocation": t - start, "what": what} for t, what in found]


def report(snap: Snapshot, run_dir: Path | None, plan: Plan | None) -> dict:
    out = {"job_id": snap.job_id, "run_dir": str(run_dir) if run_dir else None, **snap.to_dict()}
    out.update(attempt=None, attempt_waiting=False, max_requeues=None, requeues_used=None, components=[], failed=None,
               stopped=None, endpoints=[])
    out["serving_url"] = None
    out["serving"] = serving(plan, []) if plan else None
    out["model"] = None
    out["secret_file"] = None
    out["phases"] = []
    out["links"] = {}
    out["benchmark"] = None
    out["training"] = None
    out["report"] = None
    names = {g.index: g.name for g in plan.groups} if plan else {}
    for p in out["parts"]:
        p["name"] = names.get(p["group"], "")
    if run_dir is None:
        return out
    tools.transport().pull(run_dir)  # --cluster: what the job wrote there, brought back
    out["cluster"] = tools.transport().name
    attempt = (RunDir(run_dir).attempts() or [0])[-1]
    # requeued and waiting: the attempt it waits to run has no files yet; the one before's end
    # (FAILED, phases, ready files) is not the job's current state
    waiting_for = snap.restarts if snap.restarts is not None and snap.restarts > attempt else None
    attempt = attempt if waiting_for is None else waiting_for
    out["attempt"] = attempt
    out["attempt_waiting"] = waiting_for is not None
    out["max_requeues"] = plan.max_requeues if plan is not None and plan.requeue else None
    out["requeues_used"] = own_requeues(run_dir, attempt)
    out["failed"] = failed_reason(run_dir, attempt)
    out["stopped"] = stopped_reason(run_dir, attempt, snap.state)
    out["phases"] = phases(run_dir, attempt)
    out["benchmark"] = read_benchmark(run_dir)
    out["links"] = read_links(run_dir).to_json()  # submit --again and sweeps (links.json)
    out["training"] = latest_training(run_dir)
    out["report"] = report_where(run_dir)
    gone = ends(run_dir, attempt)
    if plan is not None:
        out["model"] = served_model(run_dir, plan) if any(c.role in SERVER_ROLES for c in plan.components) else None
        out["secret_file"] = secret_file(run_dir)
        # ready files outlive the job (and a requeued job's wait in the queue): only a running
        # job serves at them
        if snap.state == "RUNNING":
            out["endpoints"] = endpoints(run_dir, attempt, plan, gone)
        out["serving"] = serving(plan, out["endpoints"])
        out["serving_url"] = out["serving"]["url"]
    stopped_by_script = torn_down(out["phases"])
    for c in plan.components if plan else []:
        step = snap.step(c.name)
        out["components"].append({
            "torn_down": c.name in stopped_by_script,
            "stopped": ended.all_stopped(gone, c.name),
            "name": c.name, "group": c.group, "main": c.main, "critical": c.critical, "instances": len(c.instances),
            "step": None if step is None else {"id": step.id, "state": step.state, "exit_code": step.exit_code,
                                               "elapsed": step.elapsed, "nodes": step.nodes},
            "ready": ready_ranks(run_dir, attempt, c.name, gone),
            "dead": dead_tasks(c.name, gone),
        })
    return out


def serving_lines(rep: dict) -> list[str]:
    """Where the job serves, the model, how to authenticate: the lines under the job's state."""
    srv = rep.get("serving") or {}
    if not srv.get("components") or rep.get("state") != "RUNNING":
        return []
    urls = srv["urls"]
    what = ", ".join(srv["components"]) + ("" if srv["router"] else ", no router")
    if not urls:
        return [f"serving: not ready yet ({what})", ""]
    model = f"   model: {rep['model']}" if rep.get("model") else ""
    lines = [f"serving: {' '.join(urls)} ({what}){model}"]
    first = urls[0]
    if rep.get("secret_file"):
        on = f" on cluster {rep['cluster']} (it stays there)" if rep.get("cluster") else ""
        lines.append(f"  auth: header 'Authorization: Bearer <secret>', the secret is in {rep['secret_file']}{on}")
        auth = f"Authorization: Bearer $(cat {shlex.quote(rep['secret_file'])})"
        lines.append(f"  try{' there' if on else ''}:  curl -H \"{auth}\" {first}/v1/models")
    else:
        lines.append("  auth: none (the servers run without the job's secret: inference.auth = \"none\")")
        lines.append(f"  try:  curl {first}/v1/models")
    return lines + [""]


def dead_lines(rep: dict) -> list[str]:
    """One line per task that failed, with its cause (its end record), under the components' table."""
    out = []
    for c in rep.get("components") or []:
        for d in c.get("dead") or []:
            who = c["name"] if c["instances"] <= 1 else f"{c['name']}.{d['task']}"
            out.append(f"  dead: {ended.phrase(who, d['cause'])}")
    return out


def phase_lines(rep: dict) -> list[str]:
    found = rep.get("phases") or []
    if not found:
        return []
    rows = [[time.strftime("%H:%M:%S", time.localtime(p["time"])), f"+{p['since_allocation']}s", p["what"]]
            for p in found]
    return ["", f"  phases of attempt {rep['attempt']} (time, seconds since allocation):"] + table(rows, indent="    ")


def latest_training(run_dir: Path) -> dict | None:
    """The newest record of metrics/orchestrator.jsonl and metrics/trainer.jsonl (None without either)."""
    found = {role: last_record(RunDir(run_dir).metrics(role)) for role in ("orchestrator", "trainer")}
    found["eval"] = last_record(RunDir(run_dir).eval_metrics)  # [eval]: the newest evaluation
    return found if any(found.values()) else None


def training_lines(rep: dict) -> list[str]:
    """The latest training row: reward and its spread, off-policy lag, loss, KL, entropy, clip, memory, MFU;
    and the latest evaluation ([eval]): its step, mean reward and pass@k."""
    found = rep.get("training") or {}
    line = training_line(typed(OrchestratorRow.from_json, found.get("orchestrator")),
                         typed(TrainerRow.from_json, found.get("trainer")))
    evaluated = eval_line(found.get("eval"))
    lines = ([f"  latest {line}"] if line else []) + ([f"  latest eval {evaluated}"] if evaluated else [])
    return [""] + lines if lines else []


def benchmark_lines(rep: dict) -> list[str]:
    """The benchmark's state and one row per grid point done (RUN_DIR/benchmark/summary.json)."""
    summary = rep.get("benchmark")
    if not summary:
        return []
    lines = ["", "  " + benchmark_status_line(summary) + " (ms: median/p99; `slurmrl plot RUN_DIR` draws them)"]
    if summary.get("points"):
        lines += table(benchmark_rows(summary), indent="    ")
    if summary.get("error"):
        lines.append(f"    error: {summary['error']}")
    return lines


def report_where(run_dir: Path) -> dict:
    """Where `slurmrl report` writes the run's page, and whether it is there yet."""
    page = RunDir(run_dir).report_page()
    return {"page": str(page), "exists": page.is_file()}


def report_lines(rep: dict) -> list[str]:
    where = rep.get("report")
    if not where or not rep.get("run_dir"):
        return []
    if where["exists"]:
        return ["", f"  report: {where['page']}  (`slurmrl report {rep['run_dir']}` draws it again)"]
    return ["", f"  report: `slurmrl report {rep['run_dir']}` writes {where['page']}"]


def link_lines(rep: dict) -> list[str]:
    """The run dirs this one is linked to: the run it runs again, its own reruns, its sweep."""
    found = rep.get("links") or {}
    lines = []
    if found.get("again_of"):
        lines.append(f"  again of: {found['again_of']}")
    if found.get("again_as"):
        lines.append(f"  run again as: {', '.join(found['again_as'])}")
    if found.get("sweep"):
        lines.append(f"  a point of sweep: {found['sweep']}  (`slurmrl status {found['sweep']}`)")
    return lines


def text(rep: dict) -> str:
    head = f"job {rep['job_id']}: {rep['state']}"
    if rep["run_dir"]:
        left = ""
        if rep.get("max_requeues") is not None and rep["attempt"] is not None:
            used = rep["attempt"] if rep.get("requeues_used") is None else rep["requeues_used"]
            left = f", {max(rep['max_requeues'] - used, 0)} requeue(s) left"
        waiting = " waits in the queue" if rep.get("attempt_waiting") else ""
        head += f"  (attempt {rep['attempt']}{waiting}{left}, run dir {rep['run_dir']})"
    lines = [head] + link_lines(rep) + serving_lines(rep)
    if not rep["parts"]:
        lines.append("  not known to squeue or sacct (yet)")
    else:
        rows = [["group", "name", "job", "state", "nodes", "elapsed", "exit", "reason"]]
        for p in rep["parts"]:
            rows.append([str(p["group"]), p["name"] or "-", p["id"], p["state"], p["nodes"] or "-",
                         p["elapsed"] or "-", p["exit_code"] or "-", p["reason"] or "-"])
        lines += table(rows)
    if rep["components"]:
        rows = [["component", "group", "step", "state", "exit", "elapsed", "ready"]]
        for c in rep["components"]:
            s = c["step"] or {}
            ready = f"{len(c['ready'])}/{c['instances']}"
            dead = ",".join(str(d["task"]) for d in c.get("dead") or [])
            notes = [f"ranks {','.join(map(str, c['ready']))}"] if 0 < len(c["ready"]) < c["instances"] else []
            notes += [f"dead: {dead}"] if dead else []
            if notes:
                ready += f" ({'; '.join(notes)})"
            state = shown_state(c)
            name = c["name"] if c.get("critical", True) else f"{c['name']} (critical = false)"
            rows.append([name, str(c["group"]), s.get("id", "-"), state,
                         s.get("exit_code") or "-", s.get("elapsed") or "-", ready])
        lines.append("")
        lines += table(rows)
        lines += dead_lines(rep)
    elif rep["steps"]:  # a job id without its run dir: the steps, named after components
        rows = [["step", "name", "state", "exit", "elapsed", "nodes"]]
        rows += [[s["id"], s["name"], s["state"], s["exit_code"] or "-", s["elapsed"] or "-", s["nodes"] or "-"]
                 for s in rep["steps"]]
        lines.append("")
        lines += table(rows)
    lines += phase_lines(rep)
    lines += training_lines(rep)
    lines += benchmark_lines(rep)
    lines += report_lines(rep)
    if rep["failed"]:
        lines.append(f"FAILED: {rep['failed']}")
    elif rep.get("stopped"):
        lines.append(f"STOPPED: {rep['stopped']}")
    return "\n".join(lines)


def without_elapsed(value):
    """``value`` with every ``elapsed`` entry dropped, at any depth."""
    if isinstance(value, dict):
        return {k: without_elapsed(v) for k, v in value.items() if k != "elapsed"}
    if isinstance(value, list):
        return [without_elapsed(v) for v in value]
    return value


def submitted_at(run_dir: Path | None, job_id: str) -> float | None:
    """When the run dir's record of ``job_id`` was made (epoch seconds): its jobs.json entry, or the
    salloc allocations file; None when no record says."""
    if run_dir is None:
        return None
    for j in reversed(jobs.history(run_dir)):
        if j.job_id == job_id and j.submitted_at:
            try:
                return datetime.fromisoformat(j.submitted_at).timestamp()
            except ValueError:
                return None
    allocations = RunDir(run_dir).allocations
    return allocations.stat().st_mtime if job_id in jobs.allocations(run_dir) else None


def not_known(job_id: str, run_dir: Path | None) -> UserError:
    """A job squeue and sacct have never heard of (past the grace after its submission): one line, exit 2."""
    where = f" (the last job of run dir {run_dir})" if run_dir else ""
    return UserError(None, f"job {job_id}{where} is not known to squeue or sacct: no such job on this cluster")


def first_snapshot(w: Watch, run_dir: Path | None) -> Snapshot:
    """The job's snapshot; a job Slurm does not know yet is asked about again until
    ``NOT_FOUND_AFTER_S`` after its submission (sacct lags a submit). The last snapshot may still
    have no parts: the job is unknown."""
    snap = w.snapshot()
    since = submitted_at(run_dir, w.job_id)
    now = time.time()  # a record in the future (clock skew, a hand edit) waits one grace at most
    deadline = min(since + NOT_FOUND_AFTER_S, now + NOT_FOUND_AFTER_S) if since is not None else now
    while not snap.parts and time.time() < deadline:
        time.sleep(min(1.0, max(deadline - time.time(), 0.0)))
        snap = w.snapshot()
    return snap


def status(target: str | None, watch: bool = False, as_json: bool = False) -> int:
    run_dir, job_id = resolve(target)
    plan = load_plan(run_dir) if run_dir else None
    w = Watch(job_id)
    if not watch:
        snap = first_snapshot(w, run_dir)
        rep = report(snap, run_dir, plan)  # the run dir's files are read (and refused) first
        if not snap.parts:
            if run_dir is not None:  # what the run dir itself says, then the error
                print(strict_json.dumps(rep) if as_json else text(rep), flush=True)
            raise not_known(job_id, run_dir)
        print(strict_json.dumps(rep) if as_json else text(rep), flush=True)
        return 0
    started = time.monotonic()
    tty = sys.stdout.isatty() and not as_json
    last = None
    for snap in w.follow(poll_s=REFRESH_S):
        rep = report(snap, run_dir, plan)
        # a terminal is redrawn as the clock ticks; a log or a pipe gets a new report only when
        # something other than elapsed times changed
        shown = strict_json.dumps(rep) if as_json else text(rep)
        key = shown if tty else strict_json.dumps(without_elapsed(rep))
        if key != last:
            if tty:
                sys.stdout.write("\033[H\033[2J")
            print(shown, flush=True)
            last = key
        if not snap.parts and time.monotonic() - started > NOT_FOUND_AFTER_S:
            raise not_known(job_id, run_dir)
    return 0 if finished(rep) else 1


def finished(rep: dict) -> bool:
    """The run truly finished: Slurm says COMPLETED and its last attempt neither failed nor stopped early."""
    return rep["state"] == "COMPLETED" and not rep.get("failed") and not rep.get("stopped")


def cmd_status(args) -> int:
    with on_cluster(args):
        if is_sweep_dir(args.target):
            return sweep_report.sweep_status(args.target, watch=args.watch, as_json=args.json)
        return status(args.target, watch=args.watch, as_json=args.json)
