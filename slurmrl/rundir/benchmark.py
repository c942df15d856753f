"""RUN_DIR/benchmark/summary.json read back (``slurmrl.runtime.bench`` writes it after every grid
point): the benchmark's status, target and one entry of numbers per point done. Numbers may be
null, NaN or inf (a point whose every request failed); they are kept and shown as '-'."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import kind, read_json
from slurmrl.rundir.text import is_one_line

STATUSES = ("running", "done", "failed", "stopped")
WHOLE = ("concurrency", "input_len", "output_len", "failed", "completed", "num_prompts")


@dataclass(frozen=True)
class BenchmarkSummary:
    status: str
    target: str | None
    error: str | None
    planned_points: int | None
    points: tuple[dict, ...]
    data: dict = field(repr=False)  # the whole file, as `status --json` shows it


def _text(value, where: str, one_line: bool = True) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or (one_line and not is_one_line(value)):
        raise UserError(where, f"should be one line of text, not {kind(value) if not isinstance(value, str) else 'several'}")
    return value


def _point(p, where: str) -> dict:
    if not isinstance(p, dict):
        raise UserError(where, f"should be a table of numbers, not {kind(p)}")
    for key, value in p.items():
        if key in WHOLE and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"{where} {key}", f"should be a whole number, not {kind(value)}")
        if key.endswith(("_ms", "_throughput", "_goodput", "_share")) and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{where} {key}", f"should be a number, not {kind(value)}")
    errors = p.get("errors", [])
    if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
        raise UserError(f"{where} errors", "should be a list of messages")
    return p


def read_summary(run_dir: Path) -> BenchmarkSummary | None:
    """The benchmark's summary, or None when the run has none (yet)."""
    path = RunDir(run_dir).benchmark_summary()
    data = read_json(path, missing=None)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise UserError(str(path), f"should hold the benchmark's summary (a table), not {kind(data)}")
    status = data.get("status")
    if status not in STATUSES:
        raise UserError(f"{path} status", f"should be one of {', '.join(STATUSES)}, not "
                                          f"{repr(status)[:40] if isinstance(status, str) else kind(status)}")
    points = data.get("points")
    if not isinstance(points, list):
        raise UserError(f"{path} points", f"should be a list, not {kind(points)}")
    planned = data.get("planned_points")
    if planned is not None and (isinstance(planned, bool) or not isinstance(planned, int) or planned < 0):
        raise UserError(f"{path} planned_points", "should be a whole number")
    return BenchmarkSummary(status, _text(data.get("target"), f"{path} target"),
                            _text(data.get("error"), f"{path} error", one_line=False), planned,
                            tuple(_point(p, f"{path} points[{i}]") for i, p in enumerate(points)), data)
