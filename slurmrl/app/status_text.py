"""`slurmrl status`'s table: the typed report (``status_report.StatusReport``) as the lines a person reads:
the job's state, where it serves, its het parts, its plan components, the events, the phases, the latest
training row, the benchmark, the servers that joined, the report's page and why attempts ended."""

from __future__ import annotations

import shlex
import time

from slurmrl.app import status_events, status_joiners, status_nodes
from slurmrl.app.job_outputs import typed
from slurmrl.app.plot import eval_line, training_line
from slurmrl.app.status_report import ComponentStatus, Phase, ReportPage, StatusReport
from slurmrl.charts import benchmark_rows, benchmark_status_line
from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.contract.metrics import OrchestratorRow, TrainerRow
from slurmrl.render.summary import table


def shown_state(c: ComponentStatus) -> str:
    """A component's state in the table: Slurm's, but a step a planned stop ended (FAILED 15:0, CANCELLED)
    reads as stopped, never FAILED; no step yet but a ready file: it runs, sacct has not listed it yet."""
    state = (c.step.state if c.step else "") or ("started" if c.ready else "not started")
    if state.split()[0] not in ("FAILED", "CANCELLED") or c.dead:
        return state
    return "stopped by the script" if c.torn_down else "stopped as asked" if c.stopped else state


def serving_lines(rep: StatusReport) -> list[str]:
    """Where the job serves, the model, how to authenticate: the lines under the job's state."""
    srv = rep.serving
    if srv is None or not srv.components or rep.state != "RUNNING":
        return []
    urls = srv.urls
    what = ", ".join(srv.components) + ("" if srv.router else ", no router")
    if not urls:
        return [f"serving: not ready yet ({what})", ""]
    model = f"   model: {rep.model}" if rep.model else ""
    lines = [f"serving: {' '.join(urls)} ({what}){model}"]
    first = urls[0]
    if rep.secret_file:
        on = f" on cluster {rep.cluster} (it stays there)" if rep.cluster else ""
        lines.append(f"  auth: header 'Authorization: Bearer <secret>', the secret is in {rep.secret_file}{on}")
        auth = f"Authorization: Bearer $(cat {shlex.quote(rep.secret_file)})"
        lines.append(f"  try{' there' if on else ''}:  curl -H \"{auth}\" {first}/v1/models")
    else:
        lines.append("  auth: none (the servers run without the job's secret: inference.auth = \"none\")")
        lines.append(f"  try:  curl {first}/v1/models")
    return lines + [""]


def phase_lines(found: list[Phase], attempt: int | None) -> list[str]:
    if not found:
        return []
    rows = [[time.strftime("%H:%M:%S", time.localtime(p.time)), f"+{p.since_allocation}s", p.what] for p in found]
    return ["", f"  phases of attempt {attempt} (time, seconds since allocation):"] + table(rows, indent="    ")


def training_lines(found: dict | None) -> list[str]:
    """The latest training row (``status_read.latest_training``): reward and its spread, off-policy lag,
    loss, KL, entropy, clip, memory, MFU; and the latest evaluation ([eval]): its step, mean reward, pass@k."""
    found = found or {}
    line = training_line(typed(OrchestratorRow.from_json, found.get("orchestrator")),
                         typed(TrainerRow.from_json, found.get("trainer")))
    evaluated = eval_line(found.get("eval"))
    lines = ([f"  latest {line}"] if line else []) + ([f"  latest eval {evaluated}"] if evaluated else [])
    return [""] + lines if lines else []


def benchmark_lines(summary: BenchSummary | None) -> list[str]:
    """The benchmark's state and one row per point done (RUN_DIR/benchmark/summary.json)."""
    if not summary:
        return []
    lines = ["", "  " + benchmark_status_line(summary) + " (ms: median/p99; `slurmrl plot RUN_DIR` draws them)"]
    if summary.points:
        lines += table(benchmark_rows(summary), indent="    ")
    if summary.error:
        lines.append(f"    error: {summary.error}")
    return lines


def report_lines(run_dir: str | None, where: ReportPage | None) -> list[str]:
    if where is None or not run_dir:
        return []
    if where.exists:
        return ["", f"  report: {where.page}  (`slurmrl report {run_dir}` draws it again)"]
    return ["", f"  report: `slurmrl report {run_dir}` writes {where.page}"]


def link_lines(found: dict) -> list[str]:
    """The run dirs this one is linked to: the run it runs again, its own reruns, its sweep."""
    lines = []
    if found.get("again_of"):
        lines.append(f"  again of: {found['again_of']}")
    if found.get("again_as"):
        lines.append(f"  run again as: {', '.join(found['again_as'])}")
    if found.get("sweep"):
        lines.append(f"  a point of sweep: {found['sweep']}  (`slurmrl status {found['sweep']}`)")
    return lines


def component_rows(components: list[ComponentStatus]) -> list[list[str]]:
    rows = [["component", "group", "step", "state", "exit", "elapsed", "ready", "restarts"]]
    for c in components:
        ready = f"{len(c.ready)}/{c.instances}"
        dead = ",".join(str(d.task) for d in c.dead)
        notes = [f"ranks {','.join(map(str, c.ready))}"] if 0 < len(c.ready) < c.instances else []
        notes += [f"dead: {dead}"] if dead else []
        if notes:
            ready += f" ({'; '.join(notes)})"
        name = c.name if c.critical else f"{c.name} (critical = false)"
        rows.append([name, str(c.group), c.step.id if c.step else "-", shown_state(c),
                     (c.step.exit_code if c.step else "") or "-", (c.step.elapsed if c.step else "") or "-", ready,
                     str(c.restarts)])
    return rows


def text(rep: StatusReport) -> str:
    head = f"job {rep.job_id}: {rep.state}"
    if rep.run_dir:
        left = ""
        if rep.max_requeues is not None and rep.attempt is not None:
            used = rep.attempt if rep.requeues_used is None else rep.requeues_used
            left = f", {max(rep.max_requeues - used, 0)} requeue(s) left"
        waiting = " waits in the queue" if rep.attempt_waiting else ""
        head += f"  (attempt {rep.attempt}{waiting}{left}, run dir {rep.run_dir})"
    lines = [head] + link_lines(rep.links) + serving_lines(rep)
    if not rep.parts:
        lines.append("  not known to squeue or sacct (yet)")
    else:
        rows = [["group", "name", "job", "state", "nodes", "elapsed", "exit", "reason"]]
        for p in rep.parts:
            part = p.part
            rows.append([str(part.group), p.name or "-", part.id, part.state, part.nodes or "-",
                         part.elapsed or "-", part.exit_code or "-", part.reason or "-"])
        lines += table(rows)
    if rep.components:
        lines.append("")
        lines += table(component_rows(rep.components))
        lines += status_events.dead_lines(rep.components) + status_events.lines(rep.events)
    elif rep.snapshot.steps:  # a job id without its run dir: the steps, named after components
        rows = [["step", "name", "state", "exit", "elapsed", "nodes"]]
        rows += [[s.id, s.name, s.state, s.exit_code or "-", s.elapsed or "-", s.nodes or "-"]
                 for s in rep.snapshot.steps]
        lines.append("")
        lines += table(rows)
    lines += phase_lines(rep.phases, rep.attempt)
    lines += training_lines(rep.training)
    lines += benchmark_lines(rep.benchmark)
    lines += status_joiners.lines(rep.joiners) + report_lines(rep.run_dir, rep.report)
    lines += status_nodes.node_lines(rep.attempt_ends, rep.excluded)
    if rep.failed:
        lines.append(f"FAILED: {rep.failed}")
    elif rep.stopped:
        lines.append(f"STOPPED: {rep.stopped}")
    return "\n".join(lines)
