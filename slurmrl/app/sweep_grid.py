"""A sweep's grid: ``--grid KEY=V1,V2`` options and the recipe's ``[sweep]`` table -> points, each a
validated Recipe. The recipe file is read once; every point is its data with the point's values
applied (as ``--set`` applies them) and validated by the schema, in memory: nothing is written here.

Points are compared after the recipe's own types are applied: ``trainer.lr=1e-4,0.0001`` or, for an
integer field, ``x=1,1.0`` name one value twice and are refused, naming the grid key.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurmrl.errors import UserError
from slurmrl.recipe.load import apply_overrides, parse_override, read_toml, set_path, validate
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.sweep import MAX_SWEEP_POINTS
from slurmrl.rundir import lockfile as lock
from slurmrl.rundir import tomlw

NOT_SWEPT = {"name": "each point's run dir is named after it", "output_dir": "the sweep dir holds the points",
             "sweep": "the grid cannot sweep itself", "lock": "it is provenance, not a setting"}


def split_values(text: str) -> list[str]:
    """``1e-6,3e-6`` -> ['1e-6', '3e-6']; commas inside [...], {...} or quotes do not split."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``--grid KEY=V1,V2`` options -> {key: [value, ...]}, each value read as --set reads it."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not all(p.strip() for p in key.split(".")):
            raise UserError("--grid", f"{item!r} is not KEY.PATH=V1,V2,...")
        if key in grid:
            raise UserError(key, "is given twice with --grid; list all its values once: KEY=V1,V2")
        texts = split_values(values)
        if not values.strip() or any(t == "" for t in texts):
            raise UserError(key, f"--grid {item!r} gives an empty value; list values: {key}=V1,V2")
        grid[key] = [parse_override(f"{key}={t}")[1] for t in texts]
    return grid


def literal(value: Any) -> str:
    """A grid value as the user would write it (TOML)."""
    try:
        return tomlw._value(value)
    except TypeError:
        return repr(value)


def read_recipe_data(recipe_path: Path, overrides: Sequence[str] = ()) -> dict:
    """The recipe file as data, ``--set`` overrides applied, its [lock] table (if any) set aside."""
    if Path(recipe_path).is_dir():
        raise UserError(str(recipe_path), "is a folder; give the recipe's .toml file (or a sweep dir to submit it)")
    data = read_toml(Path(recipe_path))
    if "lock" in data:
        lock.check_table(data.pop("lock"))
    return apply_overrides(data, list(overrides))


def grid_of(data: dict, grid_items: list[str], empty_ok: bool = False) -> tuple[Recipe, dict[str, list[Any]]]:
    """The base recipe (validated with its [sweep] table) and the grid: the table's, ``--grid`` added.
    ``empty_ok``: a table without a grid is one point, the recipe itself (`validate`: the grid may
    come with `slurmrl sweep --grid`)."""
    base = validate(copy.deepcopy(data))
    grid = {k: list(vs) for k, vs in (base.sweep.grid.items() if base.sweep else [])}
    grid.update(parse_grid(grid_items))
    if not grid and not empty_ok:
        raise UserError("--grid", "no grid: give --grid KEY=V1,V2 (or a [sweep] table with grid in the recipe)")
    for key, values in grid.items():
        top = key.split(".")[0]
        if top in NOT_SWEPT:
            raise UserError(key, f"cannot be swept: {NOT_SWEPT[top]}")
        seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(seen)) != len(seen):
            raise UserError(key, f"lists a value twice: {', '.join(literal(v) for v in values)}")
    count = 1
    for values in grid.values():
        count *= len(values)
    if count > MAX_SWEEP_POINTS:
        raise UserError("--grid", f"{count} points; a sweep renders at most {MAX_SWEEP_POINTS} run dirs")
    return base, grid


def combos(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination, the first key varying slowest: [{key: value}, ...]."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def where(i: int, combo: dict[str, Any]) -> str:
    return f"sweep point {i}: " + (", ".join(f"{k}={literal(v)}" for k, v in combo.items()) or "no grid")


def set_value(data: dict, key: str, value: Any) -> None:
    set_path(data, key.split("."), copy.deepcopy(value), f"sweep {key}")


def typed_value(recipe: Recipe, key: str) -> str | None:
    """The value at ``key`` after the recipe's types were applied, for comparing points (None: the
    recipe holds no value at that path, as written; the values are then compared as written)."""
    for by_alias in (True, False):
        node: Any = recipe.model_dump(mode="json", by_alias=by_alias)
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return json.dumps(node, sort_keys=True)
    return None


def check_distinct(grid: dict[str, list[Any]], points: list[tuple[int, dict[str, Any], Recipe]]) -> None:
    """Two values of one key that the recipe reads as the same value make the same points twice."""
    for key, values in grid.items():
        typed: dict[str, Any] = {}
        for _, combo, recipe in points:
            text = json.dumps(combo[key], sort_keys=True, default=str)
            value = typed_value(recipe, key)
            if value is None:
                break
            seen = typed.setdefault(value, combo[key])
            if json.dumps(seen, sort_keys=True, default=str) != text:
                raise UserError(key, f"lists one value twice: {literal(seen)} and {literal(combo[key])} are the same "
                                     f"{key} once read as the recipe reads it; list each value once")


def point_recipes(data: dict, grid_items: list[str], name_dir: Path | None = None, empty_ok: bool = False,
                  ) -> list[tuple[int, dict[str, Any], Recipe]]:
    """Every point of the grid as a validated Recipe: [(index, {key: value}, recipe), ...]. With
    ``name_dir``, each point is named NAME-pI and its output_dir is ``name_dir`` (the sweep dir)."""
    base, grid = grid_of(data, grid_items, empty_ok)
    data = copy.deepcopy(data)
    data.pop("sweep", None)
    out = []
    for i, combo in enumerate(combos(grid)):
        pdata = copy.deepcopy(data)
        try:
            for key, value in combo.items():
                set_value(pdata, key, value)
            if name_dir is not None:
                pdata["name"], pdata["output_dir"] = point_name(base.name, i), str(name_dir)
            recipe = validate(pdata)
        except UserError as e:
            raise UserError(e.field, f"{e.message} ({where(i, combo)})") from None
        out.append((i, combo, recipe))
    check_distinct(grid, out)
    return out


def point_name(name: str, i: int) -> str:
    return f"{name}-p{i}"
