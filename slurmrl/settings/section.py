"""The base of every recipe section and role settings model: unknown keys are errors, models are
frozen, non-finite floats (``inf``, ``nan``, ``1e999``) are refused."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, WithJsonSchema

from slurmrl.contract import weight_sync as ws

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]


def _a_path(text: str) -> str:
    if not text.strip():
        raise ValueError(f"is empty{' (only spaces)' if text else ''}; give a path")
    return text


PathText = Annotated[str, AfterValidator(_a_path)]  # a file or folder: an empty one would render as ''


def _weight_sync(value: object) -> ws.WeightSync:
    if isinstance(value, (ws.Filesystem, ws.Broadcast)):
        return value
    if isinstance(value, dict):
        return ws.from_dict(value)
    raise ValueError("give a table: {mode = 'filesystem'} or {mode = 'broadcast', backend, timeout_s}")


# the planner's decision (slurmrl.contract.weight_sync) in its one serialized form, a table
WeightSyncValue = Annotated[ws.WeightSync, PlainValidator(_weight_sync), PlainSerializer(ws.to_dict),
                            WithJsonSchema({"type": "object"})]


class Section(BaseModel):
    # coerce_numbers_to_str: `--set slurm.time=90` or `account = 1234` mean the text.
    # allow_inf_nan=False: `lr = inf`, `nan` or `1e999` (infinite in a float) are refused.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True, allow_inf_nan=False, defer_build=True)
