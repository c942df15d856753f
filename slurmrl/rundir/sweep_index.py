"""SWEEP_DIR/sweep.json, a sweep's index: its name, grid, one entry per point (index, name, values)
and its submissions. Read back into :class:`SweepIndex`, checked: a point's name is a folder of
the sweep dir (one word, never a path out of it), the sweep's name goes into sweep.sbatch's
#SBATCH lines (one word), job ids are Slurm job ids."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.atomic import write_text
from slurmrl.rundir.jobids import check_job_id
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import kind, read_json

WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


@dataclass(frozen=True)
class SweepPoint:
    index: int
    name: str  # its run dir: SWEEP_DIR/<name>
    values: dict


@dataclass(frozen=True)
class SweepIndex:
    name: str
    points: tuple[SweepPoint, ...]
    grid: dict
    max_running: int | None
    submissions: tuple[dict, ...]
    data: dict = field(repr=False)  # the whole file, for writing it back with a new submission

    def point_dirs(self, sweep_dir: Path) -> list[Path]:
        return [Path(sweep_dir) / p.name for p in self.points]


def _word(value, where: str) -> str:
    if not (isinstance(value, str) and WORD.fullmatch(value) and ".." not in value):
        shown = repr(value[:40]) if isinstance(value, str) else kind(value)
        raise UserError(where, f"should be a name of letters, digits, '.', '_' and '-', not {shown}")
    return value


def _count(value, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 1 << 31:
        raise UserError(where, f"should be a whole number from {low}, not {kind(value) if not isinstance(value, int) else value}")
    return value


def read_index(sweep_dir: Path) -> SweepIndex:
    path = RunDir(sweep_dir).sweep_index
    data = read_json(path, missing=None)
    if data is None:
        raise UserError(str(sweep_dir), f"is not a sweep dir (no {RunDir.SWEEP_INDEX})")
    if not isinstance(data, dict):
        raise UserError(str(path), f"should hold a table (the sweep's index), not {kind(data)}")
    if not isinstance(data.get("points"), list):
        raise UserError(str(path), "is not a sweep index (no points)")
    if not data["points"]:
        raise UserError(str(path), "lists no points (a sweep has at least one); render the sweep again")
    name = _word(data.get("name"), f"{path} name")
    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise UserError(f"{path} grid", f"should be a table, not {kind(grid)}")
    max_running = data.get("max_running")
    if max_running is not None:
        max_running = _count(max_running, f"{path} max_running", 1)
    return SweepIndex(name, _points(data["points"], path), grid, max_running, _submissions(data.get("submissions"), path),
                      data)


def _points(entries: list, path: Path) -> tuple[SweepPoint, ...]:
    """sweep.json's points: each a table with a name no other point has (a folder of the sweep dir)."""
    points, seen = [], set()
    for i, p in enumerate(entries):
        where = f"{path} points[{i}]"
        if not isinstance(p, dict):
            raise UserError(where, f"should be a table, not {kind(p)}")
        pname = _word(p.get("name"), f"{where} name")
        if pname in seen:
            raise UserError(f"{where} name", f"{pname!r} names two points")
        seen.add(pname)
        values = p.get("values", {})
        if not isinstance(values, dict):
            raise UserError(f"{where} values", f"should be a table, not {kind(values)}")
        points.append(SweepPoint(_count(p.get("index", i), f"{where} index"), pname, values))
    return tuple(points)


def _submissions(subs, path: Path) -> tuple[dict, ...]:
    """sweep.json's submissions (none: an empty list): tables whose job ids are Slurm job ids."""
    subs = subs or []
    if not isinstance(subs, list) or not all(isinstance(s, dict) for s in subs):
        raise UserError(f"{path} submissions", "should be a list of tables")
    for s in subs:
        if not isinstance(s.get("job_ids", []), list):
            raise UserError(f"{path} submissions job_ids", "should be a list of job ids")
        for j in s.get("job_ids") or []:
            check_job_id(j, f"{path} submissions")
        if s.get("array_job") is not None or s.get("mode") == "array":
            check_job_id(s.get("array_job"), f"{path} submissions array_job")
    return tuple(subs)


def write_index(sweep_dir: Path, data: dict) -> None:
    write_text(RunDir(sweep_dir).sweep_index, json.dumps(data, indent=1) + "\n", umask=None)


def index_text(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"
