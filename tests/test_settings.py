"""One typed contract per role: the settings the planner writes are the settings the runtime reads.

``slurmrl.settings`` builds TrainerSettings / OrchestratorSettings from a recipe; render writes
``components/<role>.toml`` as ``tomlw.dumps(settings.model_dump(mode="json"))``; the runtimes
load it back with ``load(path)``. No torch here.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from slurmrl.errors import UserError
from slurmrl.plan import rules
from slurmrl.recipe import roles
from slurmrl.recipe.load import load_recipe, validate
from slurmrl.recipe.orchestrator import Orchestrator
from slurmrl.recipe.recipe import global_batch
from slurmrl.recipe.trainer import SFT_BATCH_SIZE, Trainer
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.tomlw import dumps
from slurmrl.settings import orchestrator as orch_settings
from slurmrl.settings import trainer as trainer_settings
from slurmrl.settings.trainer import TrainerKnobs

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))

RL = """\
name = "rl"
kind = "rl"
[model]
path = "m"
[inference]
[trainer]
[orchestrator]
"""


def recipe(text: str, tmp_path: Path, overrides: list[str] = (), name: str = "recipe.toml"):
    path = tmp_path / name
    path.write_text(text)
    return load_recipe(path, list(overrides))


def write(run_dir: Path, role: str, settings) -> Path:
    """What render writes for ``role``."""
    path = RunDir(run_dir).component_config(role)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(settings.model_dump(mode="json")))
    return path


def build_trainer(r, run_dir: Path, world_size: int = 1):
    return roles.trainer_settings(r, str(run_dir), world_size, global_batch(r))


# ---- defaults live in one place ------------------------------------------------------------
def test_runtime_sees_the_recipe_defaults(tmp_path):
    r = recipe(RL, tmp_path)
    s = trainer_settings.load(write(tmp_path, "trainer", build_trainer(r, tmp_path)))
    assert s.micro_batch_size == 4 and s.gradient_checkpointing == "auto"
    assert s.weight_decay == 0.0 and s.max_grad_norm == 1.0
    for name, field in TrainerKnobs.model_fields.items():  # every knob the runtime reads: the recipe's default
        assert getattr(s, name) == field.get_default(call_default_factory=True), name
    assert (s.kind, s.model, s.world_size, s.global_batch, s.run_dir) == ("rl", "m", 1, 64, str(tmp_path))
    o = orch_settings.load(write(tmp_path, "orchestrator", roles.orchestrator_settings(r, str(tmp_path))))
    assert (o.prompts_per_step, o.rollouts_per_prompt, o.max_steps) == (8, 8, Trainer().max_steps)
    assert o.served_model_name == "m" and o.model == "m" and o.environment == Orchestrator().environment


def test_served_model_name_defaults_to_the_path(tmp_path):
    r = recipe(RL.replace('path = "m"', 'path = "m"\nserved_name = "policy"'), tmp_path)
    assert roles.orchestrator_settings(r, str(tmp_path)).served_model_name == "policy"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_round_trips_without_extra_keys(path, tmp_path):
    r = load_recipe(path)
    if r.trainer is None:
        return
    built = {"trainer": build_trainer(r, tmp_path, 8)}
    if r.orchestrator is not None:
        built["orchestrator"] = roles.orchestrator_settings(r, str(tmp_path))
    loaders = {"trainer": trainer_settings.load, "orchestrator": orch_settings.load}
    for role, s in built.items():
        file = write(tmp_path, role, s)
        assert loaders[role](file) == s
        written = set(tomllib.loads(file.read_text()))
        assert written == {k for k, v in s.model_dump().items() if v is not None}, role
        assert "requests" not in written and "admin" not in written


# ---- hand edits fail with one line ------------------------------------------------------------
@pytest.mark.parametrize("edit, expected", [
    ("gpu_count = 2\n", "gpu_count: unknown key"),
    ('micro_batch_size = "four"\n', "micro_batch_size: "),
    ("micro_batch_size = 0\n", "micro_batch_size: Input should be greater than or equal to 1 (got 0)"),
    ('dtype = "float8"\n', "dtype: "),
])
def test_hand_edited_trainer_settings_fail_with_one_line(tmp_path, edit, expected):
    path = write(tmp_path, "trainer", build_trainer(recipe(RL, tmp_path), tmp_path))
    key = edit.split(" =")[0]
    lines = [x for x in path.read_text().splitlines() if not x.startswith(f"{key} =")]
    path.write_text(edit + "\n".join(lines) + "\n")
    with pytest.raises(SystemExit) as e:
        trainer_settings.load(path)
    msg = str(e.value.code)
    assert "\n" not in msg and msg.startswith(f"slurmrl: {path}: ") and expected in msg, msg


def test_missing_field_and_broken_toml_fail_with_one_line(tmp_path):
    path = write(tmp_path, "orchestrator", roles.orchestrator_settings(recipe(RL, tmp_path), str(tmp_path)))
    path.write_text("\n".join(x for x in path.read_text().splitlines() if not x.startswith("max_steps")))
    with pytest.raises(SystemExit, match=r"max_steps: missing$"):
        orch_settings.load(path)
    path.write_text("max_steps = [\n")
    with pytest.raises(SystemExit, match="not valid TOML"):
        orch_settings.load(path)
    with pytest.raises(SystemExit, match="cannot read settings"):
        orch_settings.load(tmp_path / "nope.toml")


def test_trainer_entry_point_refuses_a_bad_file_before_torch(tmp_path):
    path = write(tmp_path, "trainer", build_trainer(recipe(RL, tmp_path), tmp_path))
    path.write_text("gpu_count = 2\n" + path.read_text())  # top level: the file ends in its [wandb] table
    out = subprocess.run([sys.executable, "-m", "slurmrl.runtime.trainer", "--config", str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [f"slurmrl: {path}: gpu_count: unknown key"]


def test_settings_is_a_leaf():
    code = ("import sys, slurmrl.settings.trainer, slurmrl.settings.orchestrator; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or "
            "m.startswith(('slurmrl.plan', 'slurmrl.runtime', 'slurmrl.render'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# ---- batch size: resolved once -----------------------------------------------------------------
def test_batch_size_resolves_once(tmp_path):
    assert global_batch(recipe(RL, tmp_path)) == 64
    assert global_batch(recipe(RL, tmp_path, ["orchestrator.prompts_per_step=2"])) == 16
    rules.check(recipe(RL, tmp_path, ["trainer.batch_size=64"]))  # the same number is fine
    with pytest.raises(UserError, match="trainer.batch_size: RL batches are .* = 64"):
        rules.check(recipe(RL, tmp_path, ["trainer.batch_size=32"]))
    sft = RL.replace('kind = "rl"', 'kind = "sft"').replace("[inference]\n", "").replace("[orchestrator]\n", "")
    sft = sft.replace("[trainer]\n", '[trainer]\ndataset = "d.jsonl"\n')
    assert global_batch(recipe(sft, tmp_path)) == SFT_BATCH_SIZE
    assert global_batch(recipe(sft, tmp_path, ["trainer.batch_size=8"])) == 8


@pytest.mark.parametrize("path", [p for p in RECIPES if p.stem.startswith(("rl-", "sft-"))], ids=lambda p: p.stem)
def test_resolved_recipe_replans_identically(path, tmp_path):
    """render's recipe.toml (the recipe as resolved) gives the same plan and the same settings."""
    from slurmrl.app.build import build

    first = build(path, run_dir=tmp_path / "run")
    again = tmp_path / "again"
    again.mkdir()
    (again / path.name).write_text(first.files["recipe.toml"])
    second = build(again / path.name, run_dir=tmp_path / "run")
    assert second.recipe == first.recipe
    assert second.plan == first.plan
    assert {k: v for k, v in second.files.items() if k.startswith("components/")} == \
        {k: v for k, v in first.files.items() if k.startswith("components/")}


def test_resolved_rl_recipe_keeps_batch_size_out(tmp_path):
    r = recipe(RL, tmp_path)
    data = r.model_dump(exclude_none=True)
    assert "batch_size" not in data["trainer"]
    rules.check(validate(tomllib.loads(dumps(data)), resolved=True))


# ---- weight_sync by broadcast ---------------------------------------------------------------------
def test_weight_sync_broadcast_is_planned_and_a_bad_one_is_one_line(tmp_path):
    rules.check(recipe(RL, tmp_path, ['trainer.weight_sync="nccl"']))
    with pytest.raises(UserError) as e:
        rules.check(recipe(RL, tmp_path, ['trainer.weight_sync="ipc"']))
    assert e.value.field == "trainer.weight_sync" and "share_gpus" in str(e.value)
    path = tmp_path / "recipe.toml"
    out = subprocess.run([sys.executable, "-m", "slurmrl", "plan", str(path), "--set", 'trainer.weight_sync="ipc"'],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "trainer.weight_sync" in lines[0], out.stderr


# ---- settings sit below the recipe ------------------------------------------------------------
@pytest.mark.parametrize("module", ["slurmrl.settings.trainer", "slurmrl.settings.orchestrator",
                                    "slurmrl.settings.judge"])
def test_a_role_reads_its_settings_without_the_recipe(module):
    """The runtime loads its role's settings only: no recipe section (vllm-router's, Dynamo's, ...)."""
    code = f"import sys, {module}; print(' '.join(m for m in sys.modules if m.startswith('slurmrl.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    loaded = set(out.stdout.split())
    assert module in loaded and not {m for m in loaded if m.startswith(("slurmrl.recipe", "slurmrl.plan"))}, loaded
