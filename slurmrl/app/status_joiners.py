"""`slurmrl status RUN_DIR`'s servers that joined the job from other jobs (`submit RECIPE --join RUN_DIR`).

One entry per file in ``RUN_DIR/joined/`` (slurmrl.rundir.joined): its job id, node, URL, since when, its
state from the run dir's events (``registered``: ready, not admitted yet; ``joined``; ``left``) and the
rollouts it served (the orchestrator's metrics rows, ``served/<url>``, since it registered).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from slurmrl.contract import events
from slurmrl.render.summary import table
from slurmrl.rundir.joined import read_all
from slurmrl.rundir.metrics import read_rows
from slurmrl.rundir.paths import RunDir


def read(run_dir: Path) -> list[dict]:
    found = read_all(run_dir)
    if not found:
        return []
    paths = RunDir(run_dir)
    state = {(e.job_id, e.task, e.node): e.kind for e in events.read(paths.events) if e.kind in ("joined", "left")}
    rows = read_rows(paths.metrics("orchestrator"))
    out = []
    for j in found:
        served = sum(r.number(f"served/{j.url}") or 0 for r in rows if (r.number("time") or 0) >= j.since)
        host = j.url.split("//")[-1].rsplit(":", 1)[0]
        out.append({"job_id": j.job_id, "node": j.node, "url": j.url, "task": j.task, "since": j.since,
                    "state": state.get((j.job_id, j.task, host), "registered"), "served": int(served)})
    return out


def lines(found: list[dict] | None) -> list[str]:
    if not found:
        return []
    rows = [["joined from job", "node", "url", "since", "state", "rollouts served"]]
    rows += [[j["job_id"], j["node"], j["url"], datetime.fromtimestamp(j["since"]).strftime("%Y-%m-%d %H:%M:%S"),
              j["state"], str(j["served"])] for j in found]
    return ["", "  servers that joined (`slurmrl submit RECIPE --join RUN_DIR`):", *table(rows)]
