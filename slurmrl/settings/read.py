"""Read a settings file (``components/<role>.toml``) into its model, or exit with one line."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def problem(err: ValidationError) -> str:
    """The first validation error as ``field: what is wrong`` (and how many more there are)."""
    errors = err.errors()
    e = errors[0]
    field = ".".join(str(p) for p in e["loc"]) or "(the file)"
    if e["type"] == "extra_forbidden":
        what = "unknown key"
    elif e["type"] == "missing":
        what = "missing"
    else:
        what = f"{e['msg'].removeprefix('Value error, ')} (got {e['input']!r})"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return " ".join(f"{field}: {what}{more}".split())


def read(model: type[M], path: str | Path) -> M:
    """``path`` validated as ``model``; SystemExit with one line naming the file and the field."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SystemExit(f"slurmrl: {path}: cannot read settings: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise SystemExit(f"slurmrl: {path}: not valid TOML: {' '.join(str(e).split())}") from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise SystemExit(f"slurmrl: {path}: {problem(err)}") from None
