"""[python]: how to enter the Python environment."""

from __future__ import annotations

from pydantic import Field, field_validator

from slurmrl.recipe.fields import _check_single_line
from slurmrl.settings.section import PathText, Section


class Python(Section):
    """How to enter the Python environment when there is no container (or inside it)."""

    venv: PathText | None = Field(None, description="Virtualenv to activate (`source VENV/bin/activate`).")
    uv_project: PathText | None = Field(None, description="Run Python through `uv run --project DIR`.")
    modules: list[str] = Field(default_factory=list, description="Environment modules to `module load`.")
    setup: list[str] = Field(
        default_factory=list, description="Shell lines run verbatim in the batch shell before anything starts."
    )
    executable: PathText = Field("python3", description="Python interpreter name or path.")

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        return _check_single_line(v, "setup lines")
