"""Every leaf of the recipe schema, as the knob tests walk it."""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel

from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.schema import models


def leaves(model: type[BaseModel] = Recipe, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted path, FieldInfo) of every leaf field, sections walked (each member of a union: a path
    two engines' sections share is walked once)."""
    out: list[tuple[str, object]] = []
    for name, f in model.model_fields.items():
        subs = models(f.annotation)
        for sub in subs:
            out += [leaf for leaf in leaves(sub, f"{prefix}{name}.") if leaf[0] not in {p for p, _ in out}]
        if not subs:
            out.append((f"{prefix}{name}", f))
    return out


def _strip(ann) -> tuple[list, list]:
    """(the non-None types of an annotation, with Annotated unwrapped; their constraints)."""
    kinds, meta = [], []
    for a in typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,):
        if typing.get_origin(a) is typing.Annotated:
            base, *extra = typing.get_args(a)
            for e in extra:
                meta += getattr(e, "metadata", [e])
            a = base
        if a is not type(None):
            kinds.append(a)
    return kinds, meta
