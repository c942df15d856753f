"""Following a sweep dir: `slurmrl status SWEEP_DIR` (one row per point: its values, job, state,
attempt and latest metrics), `slurmrl plot SWEEP_DIR` (the points' reward curves on one chart) and
`slurmrl cancel SWEEP_DIR`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from slurmrl import charts
from slurmrl.app.job_outputs import failed_reason, latest_metrics, read_rewards
from slurmrl.app.sweep_dir import latest_job_ids
from slurmrl.errors import UserError
from slurmrl.render.summary import table
from slurmrl.rundir import strict_json
from slurmrl.rundir.atomic import check_target, write_bytes
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.sweep_index import read_index
from slurmrl.slurm import tools
from slurmrl.slurm.watch import snapshots

REFRESH_S = 2.0
def report(sweep_dir: Path) -> dict:
    index = read_index(sweep_dir)
    ids = latest_job_ids(sweep_dir, index.data)
    snaps = snapshots([j for j in ids if j])
    points = []
    for p, d, job_id in zip(index.points, index.point_dirs(sweep_dir), ids):
        snap = snaps.get(job_id) if job_id else None
        attempts = RunDir(d).attempts()
        attempt = attempts[-1] if attempts else None
        points.append({
            "index": p.index, "name": p.name, "run_dir": str(d), "values": p.values, "job_id": job_id,
            "state": snap.state if snap else "not submitted", "done": snap.done if snap else None,
            "attempt": attempt, "metrics": latest_metrics(d),
            "failed": failed_reason(d, attempt) if attempt is not None else None,
        })
    subs = index.submissions
    return {"sweep_dir": str(sweep_dir), "name": index.name, "grid": index.grid,
            "submission": subs[-1] if subs else None, "points": points}


def _short(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def text(rep: dict) -> str:
    sub = rep["submission"]
    if sub is None:
        how = "not submitted (`slurmrl sweep SWEEP_DIR` submits it)"
    elif sub.get("mode") == "array":
        how = f"job array {sub.get('array_job', '?')}"
    else:
        ids = sub.get("job_ids")
        how = f"{len(ids) if isinstance(ids, list) else '?'} jobs ({sub.get('why_not_array')})"
    if sub and sub.get("max_running"):
        how += f", at most {sub['max_running']} running"
    states: dict[str, int] = {}
    for p in rep["points"]:
        states[p["state"]] = states.get(p["state"], 0) + 1
    lines = [f"sweep {rep['name']}: {len(rep['points'])} point(s), {how}  ({rep['sweep_dir']})",
             "  " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())), ""]
    keys = list(rep["grid"] or {})
    rows = [["point", *keys, "job", "state", "attempt", "step", "metric"]]
    for p in rep["points"]:
        m = p["metrics"] or {}
        metric = next((f"{k} {v:.4g}" for k, v in m.items() if k != "step"), "-")
        rows.append([p["name"], *(_short(p["values"].get(k)) for k in keys), p["job_id"] or "-", p["state"],
                     "-" if p["attempt"] is None else str(p["attempt"]), str(m.get("step", "-")), metric])
    lines += table(rows)
    for p in rep["points"]:
        if p["failed"]:
            lines.append(f"{p['name']} FAILED: {p['failed']}")
    return "\n".join(lines)


def sweep_status(target: str, watch: bool = False, as_json: bool = False) -> int:
    sweep_dir = Path(target).resolve()
    last = None
    while True:
        rep = report(sweep_dir)
        shown = strict_json.dumps(rep) if as_json else text(rep)
        if shown != last:
            print(shown, flush=True)
            last = shown
        submitted = [p for p in rep["points"] if p["job_id"]]
        if not watch or all(p["done"] for p in submitted):
            break
        time.sleep(REFRESH_S)
    if not watch:
        return 0
    return 0 if submitted and all(p["state"] == "COMPLETED" for p in submitted) else 1


# ---- the comparison plot ------------------------------------------------------------------------
def sweep_plot(target: str) -> int:
    """Every point's reward curve on one chart (SWEEP_DIR/reward.png) and a table of first/last rewards."""
    sweep_dir = Path(target).resolve()
    index = read_index(sweep_dir)
    curves, rows = [], [["point", "values", "steps", "first reward", "last reward"]]
    for p, d in zip(index.points, index.point_dirs(sweep_dir)):
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in p.values.items())
        try:
            pts = read_rewards(d)
        except UserError:
            pts = []
        rows.append([p.name, label, str(len(pts)), f"{pts[0][1]:.3f}" if pts else "-",
                     f"{pts[-1][1]:.3f}" if pts else "-"])
        if pts:
            curves.append((f"{p.name}: {label}", pts))
    if not curves:
        print("\n".join(table(rows)))
        raise UserError(str(sweep_dir), "no point has reward metrics (metrics/orchestrator.jsonl) yet")
    png = RunDir(sweep_dir).reward_plot()
    check_target(png)
    print("\n".join(table(rows)))
    data = charts.curves_png(curves, f"sweep {index.name}: reward per point")
    if data is None:
        print("(install matplotlib for the PNG: pip install matplotlib)", file=sys.stderr)
        return 0
    write_bytes(png, data, umask=None)
    print(f"wrote {png}")
    return 0


def cancel_sweep(sweep_dir: str | Path, timeout_s: float) -> int:
    """scancel every point's job, then wait (bounded) until each has ended."""
    sweep_dir = Path(sweep_dir).resolve()
    index = read_index(sweep_dir)
    ids = [j for j in latest_job_ids(sweep_dir, index.data) if j]
    if not ids:
        raise UserError(str(sweep_dir), "was never submitted; `slurmrl sweep` it")
    active = [j for j, s in snapshots(ids).items() if not s.done]
    if not active:
        print(f"sweep {sweep_dir}: every point had already ended")
        return 0
    tools.out(["scancel", "--", *active])
    print(f"sweep {sweep_dir}: cancel sent to {len(active)} job(s); waiting up to {timeout_s:.0f}s", flush=True)
    deadline = time.monotonic() + timeout_s
    while True:
        snaps = snapshots(active)
        left = [j for j, s in snaps.items() if not s.done]
        if not left:
            print("  " + ", ".join(f"{j} {s.state}" for j, s in snaps.items()))
            return 0
        if time.monotonic() > deadline:
            print(f"slurmrl: job(s) {' '.join(left)} still not ended after {timeout_s:.0f}s; check "
                  f"`slurmrl status {sweep_dir}`", file=sys.stderr)
            return 1
        time.sleep(1.0)
