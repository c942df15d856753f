"""`slurmrl status`: the job's het components, and per plan component its step and readiness."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from slurmrl import layout
from slurmrl.errors import UserError
from slurmrl.plan import Plan
from slurmrl.slurm import jobs, tools
from slurmrl.slurm.watch import Snapshot, Watch
from slurmrl.summary import table

REFRESH_S = 2.0
NOT_FOUND_AFTER_S = 15.0  # sacct lags a submit by ~1 s; a job unknown for this long does not exist


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
        ids = [str(j["job_id"]) for j in jobs.history(run_dir)]
    except UserError:
        return None
    return run_dir if job_id in ids else None


def ready_ranks(run_dir: Path, attempt: int, name: str) -> list[int]:
    return list(layout.ready_tasks(run_dir, attempt, name))


def failed_reason(run_dir: Path, attempt: int) -> str | None:
    try:
        return layout.failed_file(run_dir, attempt).read_text().strip() or "(no reason given)"
    except FileNotFoundError:
        return None


def report(snap: Snapshot, run_dir: Path | None, plan: Plan | None) -> dict:
    out = {"job_id": snap.job_id, "run_dir": str(run_dir) if run_dir else None, **snap.to_dict()}
    out["attempt"] = None
    out["components"] = []
    out["failed"] = None
    names = {g.index: g.name for g in plan.groups} if plan else {}
    for p in out["parts"]:
        p["name"] = names.get(p["group"], "")
    if run_dir is None:
        return out
    attempt = (jobs.attempts(run_dir) or [0])[-1]
    out["attempt"] = attempt
    out["failed"] = failed_reason(run_dir, attempt)
    for c in plan.components if plan else []:
        step = snap.step(c.name)
        out["components"].append({
            "name": c.name, "group": c.group, "main": c.main, "instances": len(c.instances),
            "step": None if step is None else {"id": step.id, "state": step.state, "exit_code": step.exit_code,
                                               "elapsed": step.elapsed, "nodes": step.nodes},
            "ready": ready_ranks(run_dir, attempt, c.name),
        })
    return out


def text(rep: dict) -> str:
    head = f"job {rep['job_id']}: {rep['state']}"
    if rep["run_dir"]:
        head += f"  (attempt {rep['attempt']}, run dir {rep['run_dir']})"
    lines = [head]
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
            if 0 < len(c["ready"]) < c["instances"]:
                ready += f" (ranks {','.join(map(str, c['ready']))})"
            # no step yet but a ready file: it runs, sacct has not listed its step yet
            state = s.get("state") or ("started" if c["ready"] else "not started")
            rows.append([c["name"], str(c["group"]), s.get("id", "-"), state,
                         s.get("exit_code") or "-", s.get("elapsed") or "-", ready])
        lines.append("")
        lines += table(rows)
    elif rep["steps"]:  # a job id without its run dir: the steps, named after components
        rows = [["step", "name", "state", "exit", "elapsed", "nodes"]]
        rows += [[s["id"], s["name"], s["state"], s["exit_code"] or "-", s["elapsed"] or "-", s["nodes"] or "-"]
                 for s in rep["steps"]]
        lines.append("")
        lines += table(rows)
    if rep["failed"]:
        lines.append(f"FAILED: {rep['failed']}")
    return "\n".join(lines)


def without_elapsed(value):
    """``value`` with every ``elapsed`` entry dropped, at any depth."""
    if isinstance(value, dict):
        return {k: without_elapsed(v) for k, v in value.items() if k != "elapsed"}
    if isinstance(value, list):
        return [without_elapsed(v) for v in value]
    return value


def status(target: str | None, watch: bool = False, as_json: bool = False) -> int:
    run_dir, job_id = resolve(target)
    plan = jobs.load_plan(run_dir) if run_dir else None
    w = Watch(job_id)
    if not watch:
        rep = report(w.snapshot(), run_dir, plan)
        print(json.dumps(rep) if as_json else text(rep), flush=True)
        return 0
    started = time.monotonic()
    tty = sys.stdout.isatty() and not as_json
    last = None
    for snap in w.follow(poll_s=REFRESH_S):
        rep = report(snap, run_dir, plan)
        # a terminal is redrawn as the clock ticks; a log or a pipe gets a new report only when
        # something other than elapsed times changed
        shown = json.dumps(rep) if as_json else text(rep)
        key = shown if tty else json.dumps(without_elapsed(rep))
        if key != last:
            if tty:
                sys.stdout.write("\033[H\033[2J")
            print(shown, flush=True)
            last = key
        if not snap.parts and time.monotonic() - started > NOT_FOUND_AFTER_S:
            raise UserError(None, f"job {job_id} is not known to squeue or sacct")
    return 0 if snap.state == "COMPLETED" else 1
