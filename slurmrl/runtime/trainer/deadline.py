"""Save a checkpoint early enough that it finishes before Slurm ends the attempt.

The warning signal (slurm.signal, e.g. USR1@120) asks the trainer to save at its next step
boundary. When a step plus a save takes longer than the signal's lead (a large model, a slow
filesystem), that save would be killed half-written and the attempt's work since the last
periodic checkpoint lost. So at every step boundary the trainer asks: would a save at the *next*
boundary still finish before the end? If not, it saves now (once per attempt).

The end comes from the batch script (``SLURMRL_JOB_END``, epoch seconds, read from squeue when
the attempt starts; empty without a time limit). A time limit changed later with
``scontrol update`` is not seen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from slurmrl.contract import job_env

MARGIN_S = 10.0  # seconds kept free before the end, for the exit after the save
SAFETY = 1.25  # durations measured so far may grow a little (a longer step, a busier filesystem)
WRITE_BYTES_PER_S = 200e6  # first estimate of a save before one was timed


def job_end_from_env(environ=os.environ) -> float | None:
    return job_env.job_end(environ)


class Deadline:
    def __init__(self, end: float | None, checkpoint_bytes: int = 0, clock: Callable[[], float] = time.time):
        self.end, self.clock = end, clock
        self.save_s = checkpoint_bytes / WRITE_BYTES_PER_S  # replaced by the first timed save
        self.step_s = 0.0
        self.saved_early = False

    def step_took(self, seconds: float) -> None:
        self.step_s = max(self.step_s * 0.8, seconds)  # the slow steps count: decays, never averages away

    def save_took(self, seconds: float) -> None:
        self.save_s = seconds

    def seconds_left(self) -> float | None:
        return None if self.end is None else self.end - self.clock()

    def save_now(self) -> bool:
        """True when a save at the next step boundary might not finish before the end (once)."""
        left = self.seconds_left()
        if left is None or self.saved_early:
            return False
        if left - SAFETY * (self.step_s + self.save_s) > MARGIN_S:
            return False
        self.saved_early = True
        return True
