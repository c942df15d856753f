"""One W&B run per runtime role, as the recipe's ``[wandb]`` says (``slurmrl.settings.wandb``).

The trainer and the orchestrator each start one run: project and entity from ``[wandb]``, both in
one group (by default the run dir's name), named ``<name>-<role>`` with ``job_type`` the role, the
same tags. The run's id is ``<run dir name>-<role>`` with ``resume="allow"``, so a requeued job
goes on logging into the same run. The mode is ``wandb.mode``, else ``WANDB_MODE`` from the job's
environment, else ``offline`` (files under ``RUN_DIR/wandb``); ``disabled`` starts nothing. The key
is W&B's own business: it reads ``WANDB_API_KEY`` from the environment (or its ``~/.netrc``). W&B's
suggestion to install its Weave product (printed once openai or verifiers is imported: the orchestrator)
is off through wandb's own ``WANDB_DISABLE_WEAVE``, unless the job's environment sets it.

Anything that goes wrong here (no wandb installed, no key in online mode, no network) is one log line:
the metrics files under ``RUN_DIR/metrics/`` are the record, W&B a view of them.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurmrl.rundir.paths import RunDir
from slurmrl.settings.wandb import WandbSettings, safe_name


def mode(settings: WandbSettings | None, environ=os.environ) -> str:
    """online, offline or disabled: the recipe's, else the job's WANDB_MODE, else offline."""
    return (settings.mode if settings is not None and settings.mode else None) or environ.get("WANDB_MODE") or "offline"


def init_args(settings: WandbSettings | None, run_dir: Path, role: str, config: dict) -> dict:
    """The keyword arguments of ``wandb.init`` for ``role``'s run (what a test can read without wandb)."""
    w = settings or WandbSettings()
    name = w.name or safe_name(run_dir.name)
    return {
        "project": w.project, "entity": w.entity, "group": w.group or safe_name(run_dir.name), "name": f"{name}-{role}",
        "job_type": role, "tags": list(w.tags), "dir": str(run_dir), "config": config, "resume": "allow",
        "id": f"{run_dir.name}-{role}", "mode": mode(settings),
    }


def start(settings: WandbSettings | None, run_dir: Path, role: str, config: dict, log):
    """``role``'s W&B run, or None (disabled, or wandb could not start: ``log`` says why)."""
    args = init_args(settings, run_dir, role, config)
    if args["mode"] == "disabled":
        return None
    if args["mode"] == "online" and not os.environ.get("WANDB_API_KEY"):
        log("wandb: online mode and no WANDB_API_KEY in the job's environment (export it where you submit; "
            "--cluster forwards it); wandb falls back on its ~/.netrc, if any")
    try:
        import wandb

        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")  # no advertisement in the orchestrator's log
        RunDir(run_dir).wandb.mkdir(exist_ok=True)
        return wandb.init(**args)
    except Exception as e:  # optional: the JSONL is the record
        log(f"wandb off ({e.__class__.__name__}: {str(e)[:200]})")
        return None
