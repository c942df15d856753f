"""What a job writes into its run dir, read back for `status`, `plot` and a sweep's report: metrics rows
(metrics/*.jsonl), the benchmark's summary, an attempt's FAILED reason. A row or file that cannot
be read is left out, never a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

from slurmrl import layout
from slurmrl.errors import UserError

METRICS = (("orchestrator.jsonl", "reward_mean", "reward"), ("trainer.jsonl", "loss", "loss"))


def latest_metrics(run_dir: Path) -> dict | None:
    """The newest step of the run: {"step", "reward"} (RL: the orchestrator's) or {"step", "loss"} (the trainer's)."""
    for name, key, label in METRICS:
        try:
            lines = (run_dir / "metrics" / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and isinstance(rec.get(key), (int, float)):
                return {"step": rec["step"], label: rec[key]}
    return None


def read_rewards(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "metrics" / "orchestrator.jsonl"
    if not path.exists():
        raise UserError(str(run_dir), "has no metrics/orchestrator.jsonl (nor benchmark/summary.json) yet: is it "
                                      "an RL run, or a run with a [benchmark], that has started?")
    points = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
            step, reward = rec["step"], rec["reward_mean"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(step, int) and isinstance(reward, (int, float)) and math.isfinite(reward):
            points[step] = float(reward)  # a requeued step overwrites its earlier record
    return sorted(points.items())


def read_records(path: Path) -> dict[int, dict]:
    """Step -> the last record of that step in a metrics JSONL file (a requeued step overwrites)."""
    out: dict[int, dict] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out[rec["step"]] = rec
    return out


def last_record(path: Path, tail: int = 65536) -> dict | None:
    """The last whole JSON line of a metrics file, reading only its end."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            return rec
    return None


def read_benchmark(run_dir: Path) -> dict | None:
    """RUN_DIR/benchmark/summary.json, or None when there is none (or it cannot be read)."""
    try:
        summary = json.loads(layout.benchmark_summary(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and isinstance(summary.get("points"), list) else None


def failed_reason(run_dir: Path, attempt: int) -> str | None:
    try:
        return layout.failed_file(run_dir, attempt).read_text().strip() or "(no reason given)"
    except FileNotFoundError:
        return None
