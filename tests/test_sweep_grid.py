"""A sweep's points, in process (issue 27 item 6), as properties: two spellings of one value of a field
are one point, refused naming the grid key; distinct values are distinct points; --max-running takes
exactly the [sweep] table's range, anything else is one UserError."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl.app import sweep_grid
from slurmrl.app.sweep import max_running_arg
from slurmrl.errors import UserError
from slurmrl.recipe.sweep import MAX_SWEEP_POINTS
from slurmrl.settings.limits import MAX_SEED

SFT = Path(__file__).resolve().parent.parent / "recipes" / "sft-debug.toml"
DATA = tomllib.loads(SFT.read_text())

lrs = st.floats(min_value=1e-9, max_value=1.0, allow_nan=False, allow_infinity=False)
seeds = st.integers(min_value=0, max_value=MAX_SEED)


def spellings_of_float(x: float) -> list[str]:
    return [repr(x), f"{x:.17g}", f"{x:.17e}", f"{x:.25e}"]


@settings(max_examples=40, deadline=None)
@given(lrs, st.data())
def test_two_spellings_of_one_float_are_one_point(x, data):
    a, b = data.draw(st.sampled_from(spellings_of_float(x))), data.draw(st.sampled_from(spellings_of_float(x)))
    if a == b:
        b = f"{x:.17g}" if a != f"{x:.17g}" else repr(x)
    if a == b:
        return
    with pytest.raises(UserError) as e:
        sweep_grid.point_recipes(DATA, [f"trainer.lr={a},{b}"])
    assert e.value.field == "trainer.lr" and "twice" in e.value.message


@settings(max_examples=40, deadline=None)
@given(seeds, st.sampled_from(["{n}.0", "{n}.000", "{n}e0", '"{n}"']))
def test_an_integer_and_its_float_or_text_spelling_are_one_point_or_refused(n, form):
    other = form.format(n=n)
    try:
        sweep_grid.point_recipes(DATA, [f"trainer.seed={n},{other}"])
    except UserError as e:
        # the same value twice, or a spelling the integer field does not take: either way, one line naming it
        assert e.field == "trainer.seed", e
    else:
        pytest.fail(f"trainer.seed={n},{other} made two points of one value")


@settings(max_examples=30, deadline=None)
@given(st.lists(seeds, min_size=1, max_size=4, unique=True), st.lists(lrs, min_size=1, max_size=3, unique=True))
def test_distinct_values_are_distinct_points_in_order(seed_values, lr_values):
    grid = [f"trainer.seed={','.join(map(str, seed_values))}", f"trainer.lr={','.join(map(repr, lr_values))}"]
    points = sweep_grid.point_recipes(DATA, grid)
    assert [(r.trainer.seed, r.trainer.lr) for _, _, r in points] == [(s, x) for s in seed_values for x in lr_values]
    assert [i for i, _, _ in points] == list(range(len(points)))


def test_a_point_that_does_not_validate_names_itself():
    with pytest.raises(UserError) as e:
        sweep_grid.point_recipes(DATA, ["trainer.seed=1,2,-3"])
    assert e.value.field == "trainer.seed" and "(sweep point 2: trainer.seed=-3)" in e.value.message


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_max_running_takes_exactly_its_range(n):
    if 1 <= n <= MAX_SWEEP_POINTS:
        assert max_running_arg(str(n)) == n
    else:
        with pytest.raises(UserError) as e:
            max_running_arg(str(n))
        assert e.value.field == "--max-running" and "out of range" in e.value.message


@given(st.text(max_size=12).filter(lambda t: not t.strip().lstrip("+-").replace("_", "").isdigit()))
def test_max_running_refuses_what_is_not_a_whole_number(text):
    try:
        value = int(text.strip())
    except ValueError:
        with pytest.raises(UserError) as e:
            max_running_arg(text)
        assert e.value.field == "--max-running" and "needs a number of jobs" in e.value.message
    else:  # int() reads some digits the filter does not know (other scripts' digits): the range decides
        assert max_running_arg(text) == value if 1 <= value <= MAX_SWEEP_POINTS else True


DYNAMO = tomllib.loads((SFT.parent / "inference-dynamo-debug.toml").read_text())


def test_a_grid_over_an_engine_section_keeps_the_section_of_its_backend():
    points = sweep_grid.point_recipes(DYNAMO, ["inference.dynamo.speedup_ratio=1,10", "inference.startup_timeout=60,120"])
    assert [(r.inference.backend, r.inference.dynamo.speedup_ratio, r.inference.startup_timeout)
            for _, _, r in points] == [("dynamo", 1, 60), ("dynamo", 1, 120), ("dynamo", 10, 60), ("dynamo", 10, 120)]


def test_a_grid_over_another_engines_key_names_the_engine_that_reads_it():
    with pytest.raises(UserError) as e:
        sweep_grid.point_recipes(DYNAMO, ["inference.enable_eplb=true,false"])
    assert e.value.field == "inference.enable_eplb"
    assert e.value.message.startswith("not a key of backend 'dynamo' (a key of backend 'vllm')")
    assert e.value.message.endswith("(sweep point 0: inference.enable_eplb=true)")


def test_a_grid_over_the_backend_picks_each_points_section():
    data = {**DYNAMO, "inference": {k: v for k, v in DYNAMO["inference"].items() if k != "dynamo"}}
    with pytest.raises(UserError) as e:  # vLLM's section has no [inference.dynamo]; without it both points load
        sweep_grid.point_recipes(DYNAMO, ["inference.backend=dynamo,vllm"])
    assert e.value.field == "inference.dynamo" and "(sweep point 1: inference.backend=\"vllm\")" in e.value.message
    points = sweep_grid.point_recipes(data, ["inference.backend=dynamo,vllm"])
    assert [type(r.inference).__name__ for _, _, r in points] == ["DynamoInference", "VllmInference"]
