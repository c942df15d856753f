"""Issue 32 item 6: no blank value reaches a script. One rule in the recipe layer
(slurmrl.recipe.fields.blank_fields, run by the Recipe model) refuses a string of only whitespace in
every section, and an empty or whitespace-only item in every list (modules, extra engine arguments,
node lists, served names, ...): the fields are found by walking the recipe's models, so a new field is
covered without a change here. Fields that do nothing in the shape are refused (what the user set,
slurmrl.recipe.user_set): max_requeues and max_total_time without requeue, mail_user without mail_type."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recipe_leaves import leaves

from slurmrl.errors import UserError
from slurmrl.plan import plan
from slurmrl.recipe.load import apply_overrides, read_toml, validate

ROOT = Path(__file__).resolve().parent.parent
GALLERY = sorted((ROOT / "slurmrl" / "recipes").glob("*.toml"))
# whitespace of every kind str.strip() knows: space, tab, no-break space, ideographic space, em space, ...
BLANK = st.text(alphabet=st.sampled_from([" ", "\t", "\u00a0", "\u3000", "\u2003", "\u2009", "\u202f"]),
                min_size=1, max_size=6)


def _args(annotation) -> tuple:
    return typing.get_args(annotation) or ()


def _is_str(annotation) -> bool:
    return annotation is str or (typing.get_origin(annotation) is typing.Annotated and _args(annotation)[0] is str) \
        or any(_is_str(a) for a in _args(annotation) if typing.get_origin(annotation) is not typing.Literal
               and typing.get_origin(annotation) is not dict and typing.get_origin(annotation) is not list)


def _is_str_list(annotation) -> bool:
    if typing.get_origin(annotation) is list:
        return _is_str(_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_str_list(_args(annotation)[0])
    return any(_is_str_list(a) for a in _args(annotation) if typing.get_origin(annotation) is not dict)


def text_fields() -> list[tuple[str, str]]:
    """(dotted path, 'str' or 'list') of every string and list-of-strings field of the recipe."""
    return [(path, "list" if _is_str_list(f.annotation) else "str") for path, f in leaves()
            if _is_str_list(f.annotation) or _is_str(f.annotation)]


FIELDS = text_fields()


def present(data: dict, path: str) -> bool:
    """The field's section is in the recipe (a field of an absent section is refused for that reason)."""
    node = data
    for key in path.split(".")[:-1]:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return isinstance(node, dict)


CASES = [(r, p, k) for r in GALLERY for p, k in FIELDS if present(read_toml(r), p)]


def test_the_walk_finds_the_fields_the_issue_names():
    paths = {p for p, _ in FIELDS}
    for want in ("slurm.nodelist", "slurm.exclude", "slurm.mail_user", "slurm.dependency", "python.modules",
                 "inference.extra_args", "model.served_name", "slurm.job_name", "slurm.comment"):
        assert want in paths, want
    assert len(CASES) > 100


@given(case=st.sampled_from(CASES), blank=BLANK, empty_item=st.booleans(), position=st.integers(0, 2))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_blank_value_in_any_text_field_is_refused_naming_it(case, blank, empty_item, position):
    recipe, path, kind = case
    if kind == "str":
        value = blank
    else:
        good = ["--a-flag"] if "args" in path else ["x1"]
        value = good[:position] + ["" if empty_item else blank] + good[position:]
    data = apply_overrides(read_toml(recipe), [f"{path}={json.dumps(value)}"])
    with pytest.raises(UserError) as e:
        validate(data)
    assert e.value.field is not None and "\n" not in str(e.value)
    assert e.value.field == path or e.value.field.startswith(path), (path, str(e.value))


@pytest.mark.parametrize("recipe", GALLERY, ids=[r.stem for r in GALLERY])
def test_the_gallery_has_no_blank_value(recipe):
    validate(read_toml(recipe))


# ---- fields that do nothing in the shape ----------------------------------------------------------------
RL = ROOT / "slurmrl" / "recipes" / "rl-debug.toml"


def planned(*sets: str):
    return plan(validate(apply_overrides(read_toml(RL), list(sets))), "/runs/x")


@given(field=st.sampled_from(["slurm.max_requeues=0", "slurm.max_requeues=3", "slurm.max_requeues=1000",
                              'slurm.max_total_time="2-00:00:00"', 'slurm.max_total_time="90"']))
@settings(max_examples=20, deadline=None)
def test_requeue_knobs_without_requeue_are_refused(field):
    with pytest.raises(UserError) as e:
        planned("slurm.requeue=false", field)
    assert e.value.field == field.split("=")[0] and "requeue" in e.value.message
    planned("slurm.requeue=true", field)  # with requeue, they act


def test_requeue_false_alone_is_taken():
    assert planned("slurm.requeue=false").requeue is False


@pytest.mark.parametrize("mail_type", [None, "NONE"])
def test_a_mail_user_without_mail_types_is_refused(mail_type):
    sets = ['slurm.mail_user="me@example.org"'] + ([f'slurm.mail_type="{mail_type}"'] if mail_type else [])
    with pytest.raises(UserError, match="mail_type") as e:
        planned(*sets)
    assert e.value.field == "slurm.mail_user"
    planned('slurm.mail_user="me@example.org"', 'slurm.mail_type="END,FAIL"')
