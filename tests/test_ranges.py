"""Every number in a recipe has a range, stated in its description and checked before any work
that grows with it; non-finite floats and integers beyond 64 bits are refused everywhere.

The property tests push extremes through ``--set`` into ``slurmrl render`` (in process): the
answer is exit 2 with one line naming the field and nothing written, or exit 0 with a value
inside the field's range.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl import cli
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.reference import field_paths, numeric_range, range_text, reference
from slurmrl.recipe.vllm import KVOffload
from slurmrl.settings import trainer as trainer_settings
from slurmrl.settings.section import Section

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
SLOW = 20.0  # seconds: the largest job the ranges allow plans in a few

NUMERIC = [(path, field) for path, field, sub in field_paths() if sub is None and numeric_range(field) is not None]
IDS = [path for path, _ in NUMERIC]

# A gallery recipe in which each section is used (kind and mode allow it).
BASES = {"inference.prefill": "inference-pd", "inference.decode": "inference-pd",
         "inference.kv_offload": "inference-kv-offload", "benchmark": "inference-debug", "judge": "rl-judge",
         "eval": "rl-1node", "inference.dynamo": "inference-dynamo-debug"}


def base_for(path: str) -> Path:
    for prefix, name in BASES.items():
        if path.startswith(prefix + "."):
            return RECIPES / f"{name}.toml"
    return RECIPES / "rl-debug.toml"


def render(recipe: Path, overrides: list[str]) -> tuple[int, str, str, bool, float]:
    """``slurmrl render`` in process: (exit code, stdout, stderr, run dir written, CPU seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        argv = ["render", str(recipe), "--run-dir", str(run_dir)]
        for o in overrides:
            argv += ["--set", o]
        out, err = io.StringIO(), io.StringIO()
        start = time.process_time()  # CPU seconds: what planning costs, not how busy the machine is
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
        return rc, out.getvalue(), err.getvalue(), run_dir.exists(), time.process_time() - start


def value_at(recipe, path: str):
    node = recipe
    for part in path.split("."):
        node = getattr(node, part)
    return node


def check_answer(path: str, field, recipe: Path, text: str) -> tuple[int, str]:
    rc, out, err, written, seconds = render(recipe, [f"{path}={text}"])
    assert seconds < SLOW, (path, text, seconds)
    assert "Traceback" not in err
    if rc == 2:
        assert out == "" and not written, (path, text, out)
        assert len(err.splitlines()) == 1 and err.startswith("slurmrl: error: "), (path, text, err)
        return rc, err
    assert rc == 0, (path, text, rc, err)
    assert written
    value = value_at(load_recipe(recipe, [f"{path}={text}"]), path)
    low, high, exclusive = numeric_range(field)
    assert isinstance(value, (int, float)) and math.isfinite(value), (path, text, value)
    assert (value > low if exclusive else value >= low) and value <= high, (path, text, value)
    return rc, err


# ---- every number has a range ------------------------------------------------------------------


def test_numeric_fields_found():
    assert len(NUMERIC) >= 35
    assert {"slurm.gpus_per_node", "inference.nodes", "trainer.lr", "trainer.max_steps", "trainer.seq_len",
            "placement.port_base", "inference.startup_timeout", "slurm.grace_seconds",
            "inference.kv_offload.cpu_gb", "inference.kv_offload.disk_gb", "inference.tp", "inference.dp",
            "inference.prefill.replicas"} <= set(IDS)


@pytest.mark.parametrize("path,field", NUMERIC, ids=IDS)
def test_every_number_has_a_range_in_its_description(path, field):
    low, high, _ = numeric_range(field)
    assert low is not None and high is not None, f"{path} needs both bounds (ge/gt and le)"
    assert high < 2**63, path
    assert range_text(field) in field.description, f"{path}: say {range_text(field)!r} in the description"


def test_the_reference_states_every_range():
    text = reference()
    for path, field in NUMERIC:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{path}` |"))
        assert range_text(field) in row, path


def test_lora_rank_is_one_vllm_accepts():
    text = reference()
    assert "one of 1, 8, 16, 32, 64, 128, 256, 320, 512" in text
    assert "| 1 \\| 8 \\| 16" in text  # shown as numbers, not quoted strings


def test_no_float_field_takes_inf_or_nan():
    """allow_inf_nan=False on every section: also the settings files our programs read."""
    assert Section.model_config["allow_inf_nan"] is False
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(Exception, match="finite number"):
            trainer_settings.TrainerKnobs(lr=bad)
        with pytest.raises(Exception, match="finite number"):
            KVOffload(cpu_gb=bad)


def test_a_settings_file_with_inf_is_refused_in_one_line(tmp_path):
    path = tmp_path / "trainer.toml"
    path.write_text('run_dir = "/r"\nkind = "sft"\nmodel = "m"\nworld_size = 1\nglobal_batch = 4\nlr = inf\n')
    with pytest.raises(SystemExit) as e:
        trainer_settings.load(path)
    assert "lr" in str(e.value) and "finite" in str(e.value) and "\n" not in str(e.value)


# ---- the cases that crashed or grew without end ------------------------------------------------


@pytest.mark.parametrize("recipe,override,field", [
    ("inference-replicas", "slurm.gpus_per_node=1000000000000", "slurm.gpus_per_node"),  # was: MemoryError
    ("inference-kv-offload", "slurm.gpus_per_node=1000000000000", "slurm.gpus_per_node"),
    ("rl-1node", "slurm.gpus_per_node=1000000000000", "slurm.gpus_per_node"),  # was: exit 0 with 8 GPUs per node
    ("rl-debug", "inference.nodes=1000000000000", "inference.nodes"),  # was: a plan past 2.3 GB
    ("inference-replicas", "inference.nodes=100000000", "inference.nodes"),  # was: 1.6 GB in 20 s
    ("inference-pd", "inference.decode.replicas=100000000", "inference.decode.replicas"),
    ("sft-1node", "trainer.lr=1e999", "trainer.lr"),  # was: lr = inf in components/trainer.toml
    ("sft-1node", "trainer.max_steps=1000000000000000000000000000000", "trainer.max_steps"),  # was: accepted
])
def test_reported_extremes_are_refused_at_once(recipe, override, field):
    rc, out, err, written, seconds = render(RECIPES / f"{recipe}.toml", [override])
    assert rc == 2 and out == "" and not written, err
    assert len(err.splitlines()) == 1 and err.startswith(f"slurmrl: error: {field}: "), err
    assert seconds < 2, seconds


def test_rl_1node_with_a_huge_gpu_count_as_a_user_runs_it(tmp_path):
    p = subprocess.run([sys.executable, "-m", "slurmrl", "render", str(RECIPES / "rl-1node.toml"),
                        "--set", "slurm.gpus_per_node=1000000000000"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 2 and p.stdout == "" and os.listdir(tmp_path) == []
    assert p.stderr == "slurmrl: error: slurm.gpus_per_node: should be less than or equal to 64 (got 1000000000000)\n"


def test_the_whole_job_is_capped_before_planning():
    """Each field in range, the product not: refused naming the biggest part, before any plan work."""
    rc, _, err, written, seconds = render(RECIPES / "inference-replicas.toml",
                                          ["inference.nodes=16384", "slurm.gpus_per_node=64"])
    assert rc == 2 and not written and seconds < 2
    assert err.startswith("slurmrl: error: inference.nodes: the job would use 1048576 GPUs; at most 131072"), err


def test_the_largest_job_the_ranges_allow_still_plans():
    rc, _, err, written, seconds = render(RECIPES / "inference-replicas.toml",
                                          ["inference.nodes=16384", "slurm.gpus_per_node=8"])
    assert rc == 0 and written, err
    assert seconds < SLOW


# ---- every field at its bounds -----------------------------------------------------------------


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@pytest.mark.parametrize("path,field", NUMERIC, ids=IDS)
def test_just_outside_the_range_is_refused_naming_the_field(path, field):
    low, high, exclusive = numeric_range(field)
    outside = [_num(high + 1)]
    outside.append(_num(low) if exclusive else _num(low - 1))
    for text in outside:
        rc, out, err, written, _ = render(base_for(path), [f"{path}={text}"])
        assert rc == 2 and out == "" and not written, (text, err)
        assert err.startswith(f"slurmrl: error: {path}: "), (text, err)
        assert len(err.splitlines()) == 1


@pytest.mark.parametrize("path,field", NUMERIC, ids=IDS)
def test_at_the_bounds_only_other_rules_may_refuse(path, field):
    """The bounds themselves are in range; a refusal there comes from a rule between fields."""
    low, high, exclusive = numeric_range(field)
    for text in ([] if exclusive else [_num(low)]) + [_num(high)]:
        rc, err = check_answer(path, field, base_for(path), text)
        assert rc == 0 or not any(w in err for w in ("less than or equal", "greater than")), (text, err)


# ---- property: extremes through --set ----------------------------------------------------------

SPECIAL_INTS = [0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64,
                10**30, -(10**30)]
SPECIAL_TEXT = ["1e999", "-1e999", "nan", "+nan", "-nan", "inf", "+inf", "-inf", "1e308", "-1e308", "5e-324", "-0.0",
                "0x7fffffffffffffff", "0o777", "0b1", "1_000", "1e3", "true", '"5"', "[]", "{}", "''", "5x",
                "1" * 400]


def toml_float(x: float) -> str:
    return {math.inf: "inf", -math.inf: "-inf"}.get(x, "nan" if math.isnan(x) else repr(x))


def extremes(field) -> st.SearchStrategy[str]:
    low, high, _ = numeric_range(field)
    near = [low - 1, low, low + 1, high - 1, high, high + 1, high * 2, high * 10]
    return st.one_of(
        st.sampled_from(SPECIAL_INTS + [int(v) for v in near]).map(str),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.floats().map(toml_float),
        st.sampled_from([float(v) for v in near]).map(toml_float),
        st.sampled_from(SPECIAL_TEXT),
    )


@pytest.mark.parametrize("path,field", NUMERIC, ids=IDS)
def test_extremes_through_set(path, field):
    recipe = base_for(path)

    @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(extremes(field))
    def one(text):
        check_answer(path, field, recipe, text)

    one()


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(NUMERIC), st.data()), min_size=2, max_size=4), st.data())
def test_several_extremes_at_once(picks, data):
    """Several fields pushed at once: exit 0 or one line, never a traceback, never a long wait."""
    recipe = RECIPES / "rl-debug.toml"
    overrides = []
    for (path, field), _ in picks:
        if base_for(path) == recipe:
            overrides.append(f"{path}={data.draw(extremes(field))}")
    rc, out, err, written, seconds = render(recipe, overrides)
    assert seconds < SLOW and "Traceback" not in err
    assert (rc == 0 and written) or (rc == 2 and out == "" and not written and len(err.splitlines()) == 1), err
