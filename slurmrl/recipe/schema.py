"""Walking the recipe schema: the section model(s) a field holds, including a union of sections
keyed on a tag (``[inference]``, one section per ``backend``). The loader's error messages, the
resolved-recipe reader (``slurmrl.recipe.user_set``) and the reference generator walk it alike."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, Discriminator, Tag


class KeyedOn:
    """The discriminator of a union of sections: the member is the one named by ``field`` in the data,
    ``default`` when the data leaves it out (``Discriminator(KeyedOn("backend", "vllm"))``)."""

    def __init__(self, field: str, default: str):
        self.field, self.default = field, default
        self.__name__ = f"{field}_of"  # pydantic names the union's validator after it

    def __call__(self, value: Any) -> str:
        if isinstance(value, dict):
            tag = value.get(self.field, self.default)
            return tag if isinstance(tag, str) else repr(tag)
        return getattr(value, self.field, self.default)


def _parts(annotation) -> tuple[list[tuple[str | None, type[BaseModel]]], Discriminator | None]:
    """(tag, model) of every section model ``annotation`` may hold, and the union's discriminator."""
    found: list[tuple[str | None, type[BaseModel]]] = []
    disc: Discriminator | None = None
    todo: list[tuple[Any, str | None]] = [(annotation, None)]
    while todo:
        ann, tag = todo.pop(0)
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            inner, *meta = typing.get_args(ann)
            for m in meta:
                if isinstance(m, Tag):
                    tag = m.tag
                elif isinstance(m, Discriminator):
                    disc = m
            todo.append((inner, tag))
        elif origin in (typing.Union, types.UnionType):
            todo += [(a, None) for a in typing.get_args(ann)]
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            found.append((tag, ann))
    return found, disc


def variants(annotation) -> dict[str, Any]:
    """A tagged union of sections: {tag: section model}, in the union's order ({} for anything else)."""
    found, disc = _parts(annotation)
    return {tag: model for tag, model in found if tag is not None} if disc is not None else {}


def models(annotation) -> list[type[BaseModel]]:
    """Every section model a field may hold: one, each of a union's, or none (a plain value)."""
    return [model for _, model in _parts(annotation)[0]]


def model_for(annotation, value: Any = None) -> type[BaseModel] | None:
    """The section model ``value`` (a field's data) is validated as: the union's member its tag picks
    (None for a tag no member has), the one section model, or None for a plain value."""
    found, disc = _parts(annotation)
    if disc is not None and callable(disc.discriminator):
        tag = disc.discriminator(value if value is not None else {})
        return next((model for t, model in found if t == tag), None)
    return found[0][1] if found else None


def key_of(annotation) -> KeyedOn | None:
    """What a union of sections is keyed on (``backend``, and its default), None for anything else."""
    disc = _parts(annotation)[1]
    return disc.discriminator if disc is not None and isinstance(disc.discriminator, KeyedOn) else None
