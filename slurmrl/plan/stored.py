"""A run dir's plan.json read back as a :class:`Plan` (status, logs, attach, diff, submit)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from slurmrl.errors import UserError
from slurmrl.plan.model import Plan
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text


def load_plan(run_dir: Path) -> Plan | None:
    """RUN_DIR/plan.json (None when there is none); one that is not a plan is one line naming it."""
    path = RunDir(run_dir).plan
    text = read_text(path, missing=None)
    if text is None:
        return None
    try:
        return Plan.model_validate_json(text)
    except (ValidationError, ValueError, RecursionError):
        raise UserError(str(path), "cannot be read as a plan; re-render the run dir") from None


def is_preflight(plan: Plan) -> bool:
    """A preflight run dir: every component runs the probe."""
    return plan.preflight
