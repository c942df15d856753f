"""Load a recipe file, apply ``--set`` overrides, and turn validation errors into one line.

Parsing uses the standard library's ``tomllib``; a file that does not parse is said in slurmrl's own
words with its line and column (slurmrl.toml_errors), whatever TOML library is installed."""

from __future__ import annotations

import datetime
import math
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from slurmrl import toml_errors
from slurmrl.errors import UserError
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.schema import KeyedOn, key_of, models, variants
from slurmrl.recipe.user_set import unresolve
from slurmrl.rundir.read import read_input
from slurmrl.settings.limits import INT64

MAX_RECIPE_BYTES = 1 << 20  # a recipe is a few KB; this keeps /dev/zero and the like out
# The first line of a run dir's recipe.toml (slurmrl.render writes it): every default written out.
RESOLVED_HEADER = "# The recipe as resolved (overrides applied, defaults filled in)."


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a","b","c"], value). VALUE is read as TOML, else as a plain string."""
    key, sep, raw = text.partition("=")
    path = [p.strip() for p in key.split(".")]
    if not sep or not all(path):
        raise UserError("--set", f"{text!r} is not KEY.PATH=VALUE")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        if raw.lstrip().startswith(("[", "{", '"', "'")):  # meant as TOML: say what is wrong with it
            why = toml_errors.describe(e, f"v = {raw}").replace("(at line 1, ", "(at ")
            raise UserError("--set", f"{text[:200]!r}: the value is not valid TOML: {why}") from None
        value = raw  # bare words are strings: --set slurm.partition=gpu
    if isinstance(value, (datetime.date, datetime.time)):
        value = raw  # --set slurm.time=02:00:00 means the text, not a TOML time
    if isinstance(value, float) and not math.isfinite(value):
        value = raw  # --set env.X=nan means the text; a number field refuses it (allow_inf_nan=False)
    return path, value


def set_path(data: dict, path: list[str], value, what: str) -> None:
    """data[a][b]... = value for path [a, b, ...], making tables on the way; ``what`` names the change
    in the error when a step of the path is a value, not a table."""
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(".".join(path[: i + 1]), f"is a value, not a table; cannot {what}")
        node = child
    node[path[-1]] = value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        set_path(data, path, value, f"set {text!r}")
    return data


@dataclass
class _Place:
    """Where a validation error's location leads in the schema."""

    loc: tuple  # the location as the user writes it: a union's tag (``inference``'s backend) left out
    model: type[BaseModel] | None  # the section at its end (None: a value, a table of values, or unknown)
    tag: str | None = None  # the nearest union above it: the member the data picked, and what picks it
    key: KeyedOn | None = None
    others: dict[str, type[BaseModel] | None] = field(default_factory=dict)  # other members, the same place


def _annotation(model: type[BaseModel] | None, name):
    """The annotation of ``model``'s field ``name``, None where there is no such field."""
    if model is None or not isinstance(name, str) or name not in model.model_fields:
        return None
    return model.model_fields[name].annotation


def _section(model: type[BaseModel] | None, name) -> type[BaseModel] | None:
    """The one section model ``model``'s field ``name`` holds (None: a value, or a union of sections)."""
    found = models(_annotation(model, name))
    return found[0] if len(found) == 1 else None


def _place(raw: tuple) -> _Place:
    """Follow ``raw`` (pydantic's error location) through the schema from the recipe down."""
    place = _Place((), Recipe)
    parts = list(raw)
    while parts:
        part = parts.pop(0)
        place.loc += (part,)
        ann = _annotation(place.model, part)
        members = variants(ann) if ann is not None else {}
        if members and parts and parts[0] in members:
            place.tag, place.key = parts.pop(0), key_of(ann)
            place.model = members[place.tag]
            place.others = {t: m for t, m in members.items() if t != place.tag}
            continue
        place.model = _section(place.model, part)
        place.others = {t: _section(m, part) for t, m in place.others.items()}
    return place


def _unknown_key(place: _Place, name) -> str:
    """The message for a key the section at ``place`` does not have: whose key it is, or what is close."""
    import difflib

    owner = place.model
    allowed = sorted(owner.model_fields) if owner else []
    assert place.key is not None or not place.others, "others come with the union's key"
    whose = [t for t, m in place.others.items() if m is not None and name in m.model_fields]
    if whose and place.key is not None:
        hint = getattr(owner, "KEY_HINTS", {}).get(name)  # the section's word on another engine's key
        return (f"not a key of {place.key.field} {place.tag!r} (a key of {place.key.field} "
                f"{' and '.join(map(repr, whose))})" + (f": {hint}" if hint else f"; allowed: {', '.join(allowed)}"))
    close = difflib.get_close_matches(str(name), allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key; {hint}allowed: {', '.join(allowed)}"


def format_validation_error(err: ValidationError) -> UserError:
    e = err.errors()[0]
    raw = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    if e["type"] == "extra_forbidden":
        place = _place(raw[:-1])
        return UserError(".".join(str(p) for p in (*place.loc, raw[-1])), _unknown_key(place, raw[-1]))
    place = _place(raw)
    field = ".".join(str(p) for p in place.loc) or "recipe"
    if e["type"] == "union_tag_invalid":  # a union of sections, keyed on a name no member has
        ann = _annotation(_place(raw[:-1]).model, raw[-1])
        keyed, names = key_of(ann), " or ".join(map(repr, variants(ann)))
        return UserError(f"{field}.{keyed.field}" if keyed else field, f"must be {names} (got {e['ctx']['tag']!r})")
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


def check_numbers(data: dict) -> None:
    """TOML numbers are 64-bit integers and finite floats; tomllib reads bigger ones (and ``inf``,
    ``nan``, ``1e999``) without a word. Refuse them anywhere in the recipe, naming the field."""
    todo: list[tuple[str, object]] = [(k, v) for k, v in data.items()]
    while todo:
        field, v = todo.pop()
        if isinstance(v, dict):
            todo += [(f"{field}.{k}", x) for k, x in v.items()]
        elif isinstance(v, list):
            todo += [(f"{field}.{i}", x) for i, x in enumerate(v)]
        elif isinstance(v, float) and not math.isfinite(v):
            raise UserError(field, f"{v} is not a finite number (TOML's inf and nan, and 1e309 or more, are refused)")
        elif isinstance(v, int) and not isinstance(v, bool) and not INT64[0] <= v <= INT64[1]:
            raise UserError(field, f"{v} does not fit in 64 bits (TOML integers are -2^63 to 2^63-1)")


def validate(data: dict, resolved: bool = False) -> Recipe:
    """``data`` as a Recipe, or a UserError naming the field. ``resolved``: ``data`` is a resolved recipe
    (every default written out); only the values that differ from the defaults count as set."""
    check_numbers(data)
    if resolved:
        data = unresolve(Recipe, data)
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err) from None


def read_toml(path: Path) -> dict:
    """The recipe file's data (see :func:`read_recipe`)."""
    return read_recipe(path)[0]


def read_recipe(path: Path) -> tuple[dict, bool]:
    """The recipe file's data, and whether it is a resolved recipe slurmrl wrote (its first line);
    read once, so a pipe the user gives (``<(sed ... r.toml)``) is read like a file."""
    if Path(path).is_dir():
        raise UserError(str(path), "is a directory; give the recipe's .toml file")
    raw = read_input(path, MAX_RECIPE_BYTES)  # a folder, socket or device: one line
    if raw is None:
        raise UserError(str(path), "no such recipe file")
    if len(raw) > MAX_RECIPE_BYTES:
        raise UserError(str(path), f"is larger than {MAX_RECIPE_BYTES >> 20} MiB; a recipe is a few KB of TOML")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(str(path), f"is not a text file (byte {e.start} is not UTF-8); a recipe is TOML text") from None
    if "\x00" in text:
        raise UserError(str(path), "is not a text file (it holds NUL bytes); a recipe is TOML text")
    try:
        data = toml_errors.loads(text)
    except ValueError as e:
        raise UserError(str(path), f"not valid TOML: {e}") from None
    if not data:
        raise UserError(str(path), "is empty; `slurmrl init` prints a starter recipe")
    return data, text.startswith(RESOLVED_HEADER)


def otel_from_environment(data: dict, environ=None) -> dict:
    """``OTEL_*`` variables of the environment the recipe is loaded in join its ``[env]`` (the recipe's own
    values win; ``--set env.X=...`` wins over both), so they are written into the run dir's recipe and
    job.sbatch like any: they reach every step, and vLLM's ``--otlp-traces-endpoint`` comes from them
    (slurmrl.plan.engines.vllm.flags). None set: nothing changes."""
    environ = os.environ if environ is None else environ
    found = {k: v for k, v in environ.items() if k.startswith("OTEL_")}
    env = data.get("env", {})
    if found and isinstance(env, dict):
        data["env"] = {**found, **env}
    return data


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read, override, validate. Relative paths in the recipe stay relative to the recipe file."""
    path = Path(path)
    data, resolved = read_recipe(path)
    if "lock" in data:  # a run dir's lock.toml is a recipe; its [lock] table is provenance, not read here
        from slurmrl.rundir import lockfile as lock

        lock.check_table(data.pop("lock"))
        resolved = True
    if resolved:  # what the user set is what differs from the defaults; --set below is set
        data = unresolve(Recipe, data)
    data = apply_overrides(otel_from_environment(data), list(overrides))
    return validate(data)
