"""Strict types for every recipe field, decided once (slurmrl.settings.section.strict) and walked here
over every leaf field of the schema (the silent-knob walk's ``leaves``), so a field added later is
walked too: ``true`` is not a count or a number, ``2.0`` is not an integer, ``1`` is not ``true``, and
no string (a path, a name, a word of a command line) holds a NUL or another control character.

Each refusal goes through ``load_recipe`` as ``--set`` does: one ``UserError`` naming the field (or
the item in it), never a value taken."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from recipe_leaves import _strip, leaves

from slurmrl.errors import UserError
from slurmrl.recipe.load import load_recipe
from slurmrl.settings.section import CONTROL, Section, strict

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
# a gallery recipe whose section holds the field (a union's member is picked by the recipe's data)
BASES = {"inference.prefill": "inference-pd", "inference.decode": "inference-pd", "eval": "rl-1node",
         "inference.dynamo": "inference-dynamo-debug", "benchmark": "inference-debug", "judge": "rl-judge"}


def base_for(path: str) -> Path:
    return RECIPES / f"{next((n for p, n in BASES.items() if path.startswith(p + '.')), 'rl-debug')}.toml"


def kinds(f) -> tuple[set, type | None]:
    """(the scalar types a field takes, the item type of a list of them, if it is one)."""
    found, item = set(), None
    for k in _strip(f.annotation)[0]:
        origin = typing.get_origin(k)
        if origin in (list, tuple, set, frozenset):
            item = next(iter(_strip(typing.get_args(k)[0])[0]), None)
        elif isinstance(k, type):
            found.add(k)
        elif origin is typing.Literal:
            found |= {type(v) for v in typing.get_args(k)}
    return found, item


def refused(path: str, text: str, base: Path | None = None) -> UserError:
    with pytest.raises(UserError) as e:
        load_recipe(base or base_for(path), [f"{path}={text}"])
    return e.value


def names(err: UserError, path: str) -> bool:
    """The error names the field or an item of it."""
    return err.field == path or (err.field or "").startswith(path + ".")


def bad(path: str, text: str, says: str) -> str | None:
    """None when ``--set path=text`` is refused naming the field and saying ``says``, in the first
    gallery recipe where the field's section is there to take it (an engine's own field, a section that
    needs another field first); else what happened."""
    answers = []
    for base in [base_for(path), *sorted(RECIPES.glob("*.toml"))]:
        try:
            err = refused(path, text, base)
        except pytest.fail.Exception:
            return f"{path}={text}: accepted in {base.name}"
        if names(err, path) and "key" not in err.message:
            return None if any(w in err.message for w in says.split("|")) else f"{path}={text}: {err}"
        answers.append(str(err))
    return f"{path}={text}: no recipe takes the field: {answers[0]}"


LEAVES = leaves()
NUMBERS = [p for p, f in LEAVES if kinds(f)[0] & {int, float} and bool not in kinds(f)[0]]
INTEGERS = [p for p, f in LEAVES if int in kinds(f)[0] and not kinds(f)[0] & {bool, float, str}]
BOOLS = [p for p, f in LEAVES if kinds(f)[0] == {bool}]
STRINGS = [p for p, f in LEAVES if str in kinds(f)[0] or kinds(f)[1] is str]


def test_the_walk_sees_every_kind():
    for known in ("trainer.parallel.ep", "trainer.parallel.cp", "benchmark.trace_speedup", "trainer.clip_eps_high",
                  "benchmark.goodput_tpot_ms"):
        assert known in NUMBERS
    assert "slurm.exclusive" in BOOLS and "benchmark.trace" in STRINGS and "model.path" in STRINGS
    assert len(NUMBERS) > 100 and len(STRINGS) > 50


def test_true_is_not_a_number_in_any_field():
    problems = [p for path in NUMBERS for p in (bad(path, "true", "not true"), bad(path, "false", "not false")) if p]
    assert not problems, "\n".join(problems)


def test_a_float_is_not_an_integer_in_any_field():
    problems = [p for path in INTEGERS if (p := bad(path, "2.0", "without a decimal point"))]
    assert not problems, "\n".join(problems)


def test_a_number_is_not_a_boolean_in_any_field():
    problems = [p for path in BOOLS if (p := bad(path, "1", "valid boolean, true or false"))]
    assert not problems, "\n".join(problems)


def test_no_string_field_holds_a_nul():
    problems = []
    for path in STRINGS:
        single = str in kinds(dict(LEAVES)[path])[0]
        problems.append(bad(path, '"/a\\u0000b"' if single else '["/a\\u0000b"]', "U+0000|must be|pattern|boolean"))
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


CONTROLS = st.characters(codec="utf-8").filter(lambda c: CONTROL.match(c) is not None)


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(["benchmark.trace", "model.path", "slurm.job_name", "wandb.name", "slurm.comment",
                             "python.venv", "output_dir", "name", "trainer.env.X", "inference.extra_args"]),
       before=st.text(st.characters(codec="ascii", categories=["L", "N"]), max_size=5), c=CONTROLS)
def test_a_control_character_is_refused_wherever_it_is(path, before, c):
    text = f"/{before}{c}x"
    value = f"[{toml_str(text)}]" if path == "inference.extra_args" else toml_str(text)
    assert bad(path, value, f"U+{ord(c):04X}|pattern") is None


def toml_str(text: str) -> str:
    return '"' + "".join(f"\\u{ord(c):04X}" if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in '"\\' else c
                         for c in text) + '"'


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(st.booleans(), st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: v == int(v))))
def test_the_rule_is_the_models_not_a_fields(value):
    """A model written tomorrow, with no validator of its own, is strict too."""

    class Tomorrow(Section):
        count: int = 1
        ratio: float = 0.5
        flag: bool = False
        items: list[int] = []
        table: dict[str, float] = {}

    Tomorrow.model_rebuild()
    for data in ({"count": value}, {"items": [value]}, *([{"ratio": value}, {"table": {"k": value}}]
                                                       if isinstance(value, bool) else [])):
        with pytest.raises(ValueError):
            Tomorrow.model_validate(data)
    assert Tomorrow.model_validate({"count": 3, "ratio": 2, "flag": True}).ratio == 2.0


def test_strict_leaves_what_is_not_a_schema_alone():
    assert strict({"type": "literal", "expected": [{"type": "int"}]}) == {"type": "literal", "expected": [{"type": "int"}]}
    assert issubclass(Section, BaseModel)
