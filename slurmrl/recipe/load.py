"""Load a recipe file, apply ``--set`` overrides, and turn validation errors into one line.

Parsing uses the standard library's ``tomllib``; ``tomlkit`` is imported only when a file does
not parse, for the same error message as ever (and in case it accepts what tomllib refuses)."""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from slurmrl.errors import UserError
from slurmrl.recipe.schema import Recipe


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a","b","c"], value). VALUE is read as TOML, else as a plain string."""
    key, sep, raw = text.partition("=")
    path = [p.strip() for p in key.split(".")]
    if not sep or not all(path):
        raise UserError("--set", f"{text!r} is not KEY.PATH=VALUE")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare words are strings: --set slurm.partition=gpu
    if isinstance(value, (datetime.date, datetime.time)):
        value = raw  # --set slurm.time=02:00:00 means the text, not a TOML time
    return path, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(".".join(path[: i + 1]), f"is a value, not a table; cannot set {text!r}")
            node = child
        node[path[-1]] = value
    return data


def _model_at(loc: tuple, model: type[BaseModel] = Recipe) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at ``loc`` (for suggestions)."""
    for part in loc:
        if not isinstance(part, str) or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        for cand in getattr(ann, "__args__", (ann,)):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
        else:
            return None
    return model


def format_validation_error(err: ValidationError) -> UserError:
    import difflib

    e = err.errors()[0]
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    field = ".".join(str(p) for p in loc) or "recipe"
    if e["type"] == "extra_forbidden":
        owner = _model_at(loc[:-1])
        allowed = sorted(owner.model_fields) if owner else []
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return UserError(field, f"unknown key; {hint}allowed: {', '.join(allowed)}")
    if e["type"] == "missing":
        return UserError(field, "is required")
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] in ("literal_error", "enum"):
        msg = msg.replace("Input should be", "must be")
    else:
        msg = msg.replace("Input should be", "should be")
    shown = e.get("input")
    if e["type"] not in ("value_error",) and not isinstance(shown, (dict, list)):
        msg += f" (got {shown!r})"
    return UserError(field, msg)


def validate(data: dict) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err) from None


def read_toml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(str(path), "no such recipe file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise UserError(str(path), f"cannot read recipe: {e.__class__.__name__}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return _parse_with_tomlkit(path, text)


def _parse_with_tomlkit(path: Path, text: str) -> dict:
    """What tomllib refused: tomlkit's verdict, and its error message (the one users have seen)."""
    import tomlkit
    from tomlkit.exceptions import ParseError

    try:
        return tomlkit.parse(text).unwrap()
    except ParseError as e:
        raise UserError(str(path), f"not valid TOML: {e}") from None


def load_recipe(path: str | Path, overrides: list[str] = ()) -> Recipe:
    """Read, override, validate. Relative paths in the recipe stay relative to the recipe file."""
    path = Path(path)
    data = apply_overrides(read_toml(path), list(overrides))
    return validate(data)
