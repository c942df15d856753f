"""A serving component's restart policy, defined once: the recipe's ``restart``, ``max_restarts`` and
``restart_backoff_s`` (``slurmrl.recipe.restart``), carried by the planner onto the supervisor's command
line (``--restart``, ``--max-restarts``, ``--restart-backoff``) and read by the supervisor's restart loop
(``slurmrl.runtime.steps.restart``). Standard library only: the supervisor starts before any engine.

The defaults are for a days-long RL job (docs/slurm.md, "Restarts"): a server that dies is restarted
in place, at most 5 times per task and attempt, after 10 s, 20 s, 40 s, ... capped at 300 s."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("never", "on-failure", "always")
DEFAULT_MODE = "on-failure"
DEFAULT_MAX_RESTARTS = 5
DEFAULT_BACKOFF_S = 10
BACKOFF_CAP_S = 300  # the doubling stops here: a node that needs longer is not coming back by waiting
MAX_RESTARTS_LIMIT = 1000
MAX_BACKOFF_S = 3600


@dataclass(frozen=True)
class Policy:
    """When the supervisor relaunches its command after it ended, and after how long."""

    mode: str = "never"  # never | on-failure | always
    max_restarts: int = DEFAULT_MAX_RESTARTS
    backoff_s: float = DEFAULT_BACKOFF_S

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"restart {self.mode!r} is not one of {', '.join(MODES)}")
        if not 0 <= self.max_restarts <= MAX_RESTARTS_LIMIT:
            raise ValueError(f"max_restarts {self.max_restarts} is not within 0-{MAX_RESTARTS_LIMIT}")
        if not 0 <= self.backoff_s <= MAX_BACKOFF_S:
            raise ValueError(f"restart_backoff_s {self.backoff_s} is not within 0-{MAX_BACKOFF_S}")

    def delay(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1 for the first): the backoff, doubled for
        each restart before it, never more than ``BACKOFF_CAP_S`` (nor less than the backoff itself)."""
        if restart < 1:
            raise ValueError("restarts count from 1")
        return min(self.backoff_s * 2.0 ** min(restart - 1, 32), max(float(BACKOFF_CAP_S), self.backoff_s))

    def wants(self, code: int, asked: bool, done: int) -> bool:
        """Relaunch a command that exited with ``code`` after ``done`` restarts? Never after a stop the
        supervisor was asked for; ``on-failure``: only when it failed (non-zero: the guard turns a server
        that ends unasked into 1); ``always``: whatever its code."""
        if asked or self.mode == "never" or done >= self.max_restarts:
            return False
        return self.mode == "always" or code != 0
