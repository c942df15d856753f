"""Generate the recipe reference (docs/recipe-reference.md) from the schema's field descriptions.

    python -m slurmrl.recipe.reference > docs/recipe-reference.md
"""

from __future__ import annotations

import typing
from collections.abc import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.schema import key_of, models, variants


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else str(a).lower() if isinstance(a, bool) else str(a)
                             for a in typing.get_args(annotation))  # TOML spells booleans true / false
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, __import__("types").UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if origin is dict:
        values = _type_name(typing.get_args(annotation)[1])
        return "table of " + ("strings" if values == "string" else values + " values")
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def _default(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is None or field.default is PydanticUndefined:
        return "—"
    value = field.default
    return f"`{str(value).lower() if isinstance(value, bool) else value!r}`"


def numeric_range(field) -> tuple[float | None, float | None, bool] | None:
    """(low, high, low is exclusive) of an int or float field, None for other fields."""
    ann = field.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)] if typing.get_origin(ann) in (
        typing.Union, __import__("types").UnionType) else [ann]
    if len(args) != 1:
        return None
    inner, metadata = args[0], list(field.metadata)
    if typing.get_origin(inner) is typing.Annotated:
        inner, *extra = typing.get_args(inner)
        metadata += [m for e in extra for m in (getattr(e, "metadata", None) or [e])]
    if inner not in (int, float):
        return None
    low = high = None
    exclusive = False
    for m in metadata:
        if getattr(m, "ge", None) is not None:
            low = m.ge
        if getattr(m, "gt", None) is not None:
            low, exclusive = m.gt, True
        if getattr(m, "le", None) is not None:
            high = m.le
    return low, high, exclusive


def range_text(field) -> str | None:
    """How a numeric field's description states its range: ``1-64`` or ``above 0, at most 1``."""
    r = numeric_range(field)
    if r is None:
        return None
    low, high, exclusive = (int(x) if isinstance(x, float) and x.is_integer() else x for x in r)
    return f"above {low}, at most {high}" if exclusive else f"{low}-{high}"


def field_paths(model: type[BaseModel] = Recipe, prefix: str = "") -> Iterator[tuple[str, FieldInfo, type | None]]:
    """Every (dotted path, field info, sub-model) in the schema, depth first. A union of sections
    (``inference``, one per backend) has no one sub-model: each member's fields follow, under one path."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        subs = models(field.annotation)
        yield path, field, subs[0] if len(subs) == 1 else None
        for sub in subs:
            yield from field_paths(sub, path + ".")


def _tables(model: type[BaseModel], prefix: str, where: str, tables: dict[str, list[str]]) -> None:
    """The reference's rows of ``model``'s fields, by table; ``where`` names a union's member."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        members = variants(field.annotation)
        subs = list(members.items()) if members else [(None, m) for m in models(field.annotation)]
        kind = "table" if subs else _type_name(field.annotation)
        if members:
            key = key_of(field.annotation)
            assert key is not None, "a union of sections is keyed"
            kind = f"table: one of {len(members)}, by `{key.field}`"
        meaning = (field.description or "").replace("|", "\\|")
        tables.setdefault(f"{prefix[:-1]}{where}", []).append(f"| `{path}` | {kind} | {_default(field)} | {meaning} |")
        for tag, sub in subs:
            label = f' with {key.field} = "{tag}"' if tag is not None and key is not None else where
            tables.setdefault(f"{path}{label}", [])
            _tables(sub, path + ".", label, tables)


def reference() -> str:
    out = [
        "# Recipe reference",
        "",
        "Generated from the schema (`python -m slurmrl.recipe.reference > docs/recipe-reference.md`);",
        "a test fails when a field is missing here. Unknown keys are errors. Every field can be",
        "overridden on the command line: `--set section.key=VALUE` (VALUE is read as TOML).",
        "Types are strict in every field: `true` is not a number, `2.0` is not an integer, `1` is not",
        "a boolean (a number's text, `'5'`, is its number), and no string holds a control character",
        "(a NUL, an escape; a path is one line).",
        "",
    ]
    tables: dict[str, list[str]] = {"": []}
    _tables(Recipe, "", "", tables)
    for section, rows in tables.items():
        if not rows:
            continue
        table, _, member = section.partition(" with ")  # a union's member: "inference with backend = ..."
        title = f"## [{table}]" + (f" (with {member})" if member else "") if section else "## Top level"
        out += [title, "", "| field | type | default | meaning |",
                "|---|---|---|---|", *rows, ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(reference(), end="")
