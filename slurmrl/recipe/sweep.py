"""[sweep]: a grid of recipe values."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from slurmrl.settings.section import Section

MAX_SWEEP_POINTS = 256  # run dirs one sweep renders


class Sweep(Section):
    """A grid of recipe values (`slurmrl sweep RECIPE`): one complete run dir per point, submitted as
    a job array where Slurm allows one (else as one job per point), at most `max_running` at once."""

    grid: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$|^[A-Za-z0-9_-]+$")],
        Annotated[list[bool | int | float | str], Field(min_length=1, max_length=MAX_SWEEP_POINTS)],
    ] = Field(
        default_factory=dict,
        description="Field path -> the values it takes, e.g. `{ \"trainer.lr\" = [1e-6, 3e-6], \"inference.tp\" = [1, 2] }`; "
        "every combination is a point (`--grid KEY=V1,V2` adds or replaces a key).",
    )
    max_running: Annotated[int, Field(ge=1, le=MAX_SWEEP_POINTS)] | None = Field(
        None, description=f"Points running at once (1-{MAX_SWEEP_POINTS}); default: all (`--max-running N`)."
    )
