"""The restart fields every serving section has (``[inference]``, ``[judge]``, ``[inference.router]``):
``restart``, ``max_restarts``, ``restart_backoff_s``. Their defaults and ranges are the contract's
(``slurmrl.contract.restart_policy``), which the supervisor reads; the planner carries them to its command line."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from slurmrl.contract import restart_policy

RestartMode = Literal["never", "on-failure", "always"]


def mode(what: str) -> Any:
    return Field(
        restart_policy.DEFAULT_MODE,
        description=f"When a task of {what} ends, relaunch it in place (same node, GPUs, ports and environment; a vLLM "
        "server spanning several nodes: all its tasks, as a whole) and "
        "wait for it to be ready as at the start: `on-failure` when it failed (a server that ends unasked has), "
        "`always` whatever its code, `never`: the task ends and is recorded as dead. Every death and restart is "
        "an event in the run dir's events.jsonl (`slurmrl status`). docs/slurm.md: \"Restarts\".",
    )


def max_restarts(what: str) -> Any:
    return Field(
        restart_policy.DEFAULT_MAX_RESTARTS, ge=0, le=restart_policy.MAX_RESTARTS_LIMIT,
        description=f"Restarts of each task of {what} per attempt; then the task ends, recorded as dead "
        f"(0-{restart_policy.MAX_RESTARTS_LIMIT}).",
    )


def backoff() -> Any:
    return Field(
        restart_policy.DEFAULT_BACKOFF_S, ge=0, le=restart_policy.MAX_BACKOFF_S,
        description=f"Seconds before the first restart, doubled for each restart after it, at most "
        f"{restart_policy.BACKOFF_CAP_S} s (0-{restart_policy.MAX_BACKOFF_S}).",
    )
