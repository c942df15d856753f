"""What the user set: the no-silent-knobs checks ("only applies to ...") ask whether a field was
given in the recipe (or by ``--set``), whatever its value, not whether it differs from its default.

A field set to its default in a shape that never reads it is as silent as any other value. A
resolved recipe (a run dir's recipe.toml or lock.toml, every default written out) counts only the
values that differ from the defaults as set: ``slurmrl.recipe.load`` drops the rest before it
validates one (``unresolve``).
"""

from __future__ import annotations

from pydantic import BaseModel

from slurmrl.recipe.schema import model_for


def user_set(section: BaseModel, name: str) -> bool:
    """``section.name`` was set by the user (in the recipe or by ``--set``), whatever its value."""
    return name in section.model_fields_set


def _same(value, default) -> bool:
    return value == default and isinstance(value, bool) == isinstance(default, bool)


def unresolve(model: type[BaseModel], data: dict) -> dict:
    """``data`` (a resolved recipe's tables for ``model``) without the values equal to their field's
    default, and without tables left empty whose section is always there (``[inference.router]``)."""
    out = {}
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:  # unknown keys stay, for validation to refuse by name
            out[key] = value
            continue
        sub = model_for(field.annotation, value)  # a union's member: the one the data names
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if sub is not None and isinstance(value, dict):
            value = unresolve(sub, value)
            if not value and isinstance(default, BaseModel):
                continue
        elif not field.is_required() and _same(value, default):
            continue
        out[key] = value
    return out
