"""Walking the recipe schema: the section model(s) a field holds, including a union of sections
keyed on a tag (``[inference]``, one section per ``backend``). The loader's error messages, the
resolved-recipe reader (``slurmrl.recipe.user_set``) and the reference generator walk it alike.
``OnDemand``: an optional section (or union of sections) validated by its own model, built when a recipe
holds it."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, Discriminator, Tag, ValidationError
from pydantic_core import PydanticKnownError
from pydantic_core import core_schema as cs

ERROR_TYPES = frozenset(typing.get_args(cs.ErrorType))


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


class OnDemand:
    """``Annotated[Part | None, OnDemand]``: an optional section (or a union of sections keyed on a tag) that
    the recipe's own schema does not take in. The recipe validates the field with the part's own model,
    which pydantic builds the first time a recipe holds one (every section defers its build), and dumps
    it as the model it is (``model_dump``'s include, exclude, exclude_unset and mode reach it alike). A
    recipe leaves most optional sections out and names one engine; `slurmrl plan` builds no model of the
    others (~15 ms of a plan). Errors are pydantic's own, in the same places: the field, then the union's
    tag (``inference.vllm.tp``), then the part's (``tests/test_cli_imports.py``, ``tests/test_bad_recipes.py``)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        found, disc = _parts(source)
        assert found and type(None) in typing.get_args(source), f"OnDemand takes Part | None, not {source}"
        key = disc.discriminator if disc is not None else None
        if key is None:
            assert len(found) == 1, f"OnDemand takes one section or a union keyed on a tag, not {source}"
            return _plain(found[0][1].model_validate)
        members = {tag: model for tag, model in found if tag is not None}
        return _plain(lambda value: _member(members, key, value))


def _plain(validate) -> Any:
    """A core schema: None stays None, anything else goes to ``validate``; dumped as what it is."""
    return cs.no_info_plain_validator_function(lambda value: None if value is None else validate(value),
                                               serialization=cs.simple_ser_schema("any"))


def _member(members: dict[str, type[BaseModel]], key, value: Any) -> BaseModel:
    """``value`` as the member its tag picks, errors placed under the tag as pydantic's tagged union places them."""
    tag = key(value)
    if tag not in members:
        raise PydanticKnownError("union_tag_invalid", {"discriminator": f"{key.__name__}()", "tag": tag,
                                                       "expected_tags": ", ".join(map(repr, members))})
    try:
        return members[tag].model_validate(value)
    except ValidationError as e:
        lines = [{"type": x["type"], "loc": (tag, *x["loc"]), "input": x["input"], **({"ctx": x["ctx"]} if "ctx" in x else {})}
                 for x in e.errors(include_url=False) if x["type"] in ERROR_TYPES]
        if len(lines) < e.error_count():  # an error type pydantic cannot raise again: as it is
            raise
        raise ValidationError.from_exception_data(e.title, lines) from None  # type: ignore[arg-type]
