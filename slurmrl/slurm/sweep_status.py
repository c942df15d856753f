"""`slurmrl status SWEEP_DIR` (one row per point: its values, job, state, attempt and latest
metrics) and `slurmrl plot SWEEP_DIR` (the points' reward curves on one chart)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir import metrics
from slurmrl.rundir.paths import RunDir
from slurmrl.summary import table
from slurmrl.sweep import latest_job_ids, point_dirs, read_index

REFRESH_S = 2.0
METRICS = (("orchestrator", "reward_mean", "reward"), ("trainer", "loss", "loss"))


def latest_metrics(run_dir: Path) -> dict | None:
    """The newest step of the run: {"step", "reward"} (RL: the orchestrator's) or {"step", "loss"} (the trainer's)."""
    for role, key, label in METRICS:
        rows = metrics.read_rows(RunDir(run_dir).metrics(role))
        for row in reversed(rows):
            value = row.values.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return {"step": row.step, label: value}
    return None


def report(sweep_dir: Path) -> dict:
    from slurmrl.slurm.status import failed_reason
    from slurmrl.slurm.watch import snapshots

    index = read_index(sweep_dir)
    ids = latest_job_ids(sweep_dir, index)
    snaps = snapshots([j for j in ids if j])
    points = []
    for p, d, job_id in zip(index.points, point_dirs(sweep_dir, index), ids):
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
        how = f"job array {sub['array_job']}"
    else:
        how = f"{len(sub.get('job_ids', []))} jobs ({sub.get('why_not_array')})"
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
        shown = json.dumps(rep) if as_json else text(rep)
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
    from slurmrl.plot import read_rewards

    sweep_dir = Path(target).resolve()
    index = read_index(sweep_dir)
    curves, rows = [], [["point", "values", "steps", "first reward", "last reward"]]
    for p, d in zip(index.points, point_dirs(sweep_dir, index)):
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in p.values.items())
        try:
            pts = read_rewards(d)
        except UserError:
            pts = []
        rows.append([p.name, label, str(len(pts)), f"{pts[0][1]:.3f}" if pts else "-",
                     f"{pts[-1][1]:.3f}" if pts else "-"])
        if pts:
            curves.append((f"{p.name}: {label}", pts))
    print("\n".join(table(rows)))
    if not curves:
        raise UserError(str(sweep_dir), "no point has reward metrics (metrics/orchestrator.jsonl) yet")
    png = RunDir(sweep_dir).reward_plot()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("(install matplotlib for the PNG: pip install matplotlib)", file=sys.stderr)
        return 0
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for label, pts in curves:
        ax.plot([s for s, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title(f"sweep {index.name}: reward per point")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    print(f"wrote {png}")
    return 0
