"""`status`: why each attempt of the job ended (its class, and whether it was requeued and why or why
not) and the nodes the run keeps out (node, reason, since when). From the run dir's ``attempt_ended``
and ``excluded`` events, and from the job script's notes (logs/attempt-N/END, NODE_FAULTS) of attempts
not recorded as events yet (the next attempt records them; a job that ended for good may not have)."""

from __future__ import annotations

import time
from pathlib import Path

from slurmrl.contract import attempt_end, events
from slurmrl.rundir.paths import RunDir


def node_report(run_dir: Path, job_id: str) -> dict:
    """``attempt_ends``: per attempt of job ``job_id``, oldest first; ``excluded``: node -> reason, since, attempt."""
    paths = RunDir(run_dir)
    have = events.read(paths.events)
    recorded = attempt_end.ends(have)
    ends = []
    for a in paths.attempts():
        e = recorded.get((job_id, a))
        if e is not None:
            ends.append({"attempt": a, "class": e.detail.get("class"), "requeued": e.detail.get("requeued"),
                         "why": e.cause, "nodes": e.detail.get("nodes", []), "time": e.time})
        elif (note := attempt_end.read_end(paths.end_note(a))) is not None:
            nodes = sorted(attempt_end.read_faults(paths.node_faults(a))) if note.cls == "node" else []
            ends.append({"attempt": a, "class": note.cls, "requeued": note.requeued, "why": note.why,
                         "nodes": nodes, "time": note.time})
    excluded = {node: {"reason": e.cause, "since": e.time, "attempt": e.attempt, "job_id": e.job_id}
                for node, e in attempt_end.excluded(have).items()}
    for a in paths.attempts():
        for node, reason in attempt_end.read_faults(paths.node_faults(a)).items():
            excluded.setdefault(node, {"reason": reason, "since": None, "attempt": a, "job_id": job_id})
    return {"attempt_ends": ends, "excluded": excluded}


def node_lines(attempt_ends: list[dict] | None, excluded: dict[str, dict] | None) -> list[str]:
    out = []
    for e in attempt_ends or []:
        nodes = f" ({','.join(e['nodes'])})" if e["nodes"] else ""
        requeued = "requeued" if e["requeued"] else "not requeued"
        out.append(f"  attempt {e['attempt']} ended: {e['class']}{nodes}, {requeued}: {e['why']}")
    for node, x in sorted((excluded or {}).items()):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(x["since"])) if x["since"] else "now"
        attempt = f" (attempt {x['attempt']})" if x["attempt"] is not None else ""
        out.append(f"  excluded {node} since {since}{attempt}: {x['reason']}")
    return [""] + out if out else []
