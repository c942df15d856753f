"""The base of every recipe section and role settings model: unknown keys are errors, models are
frozen, non-finite floats (``inf``, ``nan``, ``1e999``) are refused."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]


def _a_path(text: str) -> str:
    if not text.strip():
        raise ValueError(f"is empty{' (only spaces)' if text else ''}; give a path")
    return text


PathText = Annotated[str, AfterValidator(_a_path)]  # a file or folder: an empty one would render as ''


class Section(BaseModel):
    # coerce_numbers_to_str: `--set slurm.time=90` or `account = 1234` mean the text.
    # allow_inf_nan=False: `lr = inf`, `nan` or `1e999` (infinite in a float) are refused.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True, allow_inf_nan=False, defer_build=True)
