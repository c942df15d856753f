"""The base of every recipe section and role settings model: unknown keys are errors, models are
frozen, non-finite floats (``inf``, ``nan``, ``1e999``) are refused, and every field's type is strict
(:func:`strict`), once here for every field, today's and tomorrow's."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import core_schema as cs

from slurmrl.contract import weight_sync as ws

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]

# control characters no recipe string holds: C0 but tab, newline and carriage return; DEL; C1
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
LINE_BREAK = re.compile(r"[\n\r]")


def _no_control(text: str) -> str:
    m = CONTROL.search(text)
    if m:
        raise ValueError(f"holds a control character (U+{ord(m.group()):04X} at character {m.start() + 1}); remove it")
    return text


def _a_path(text: str) -> str:
    if not text.strip():
        raise ValueError(f"is empty{' (only spaces)' if text else ''}; give a path")
    m = LINE_BREAK.search(text)
    if m:
        raise ValueError(f"holds a line break (character {m.start() + 1}); a path is one line")
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

_NOT_SCHEMAS = frozenset({"metadata", "serialization", "default", "expected", "ref", "schema_ref"})


def _a_count(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError(f"should be a valid integer, not {str(value).lower()}")
    if isinstance(value, float):
        raise ValueError(f"should be a valid integer, without a decimal point (got {value!r})")
    return value


def _a_number(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError(f"should be a valid number, not {str(value).lower()}")
    return value


def _a_truth(value: object) -> object:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"should be a valid boolean, true or false (got {value!r})")
    return value


_BEFORE = {"int": _a_count, "float": _a_number, "bool": _a_truth}


def strict(schema: Any) -> Any:
    """``schema`` (a pydantic core schema) with strict types everywhere it asks for one: ``true`` is not
    a count or a number, ``2.0`` is not an integer, ``1`` is not ``true`` (an integer is a number, and
    a number's text, ``'5'`` or ``--set x=5``, is its number); every string is free of control
    characters (a NUL in a path would end it in a C program)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in _NOT_SCHEMAS else strict(v)) for k, v in schema.items()}
    kind = out.get("type")
    if kind in _BEFORE:
        return cs.no_info_before_validator_function(_BEFORE[kind], out)
    if kind == "str":
        return cs.no_info_after_validator_function(_no_control, out)
    if kind == "literal" and not any(isinstance(v, bool) for v in out["expected"]):  # True == 1: not a 1
        numeric = [v for v in out["expected"] if isinstance(v, (int, float))]
        if numeric:
            return cs.no_info_before_validator_function(_a_number if any(isinstance(v, float) for v in numeric)
                                                        else _a_count, out)
    return out


class Section(BaseModel):
    # coerce_numbers_to_str: `--set slurm.time=90` or `account = 1234` mean the text.
    # allow_inf_nan=False: `lr = inf`, `nan` or `1e999` (infinite in a float) are refused.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True, allow_inf_nan=False, defer_build=True)

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        return strict(handler(source))
