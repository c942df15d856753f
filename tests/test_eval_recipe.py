"""[eval] and [wandb]: bad values are one line naming the field (exit 2, nothing written); good ones
reach components/orchestrator.toml and trainer.toml resolved (the held-out split of the training
environment, max_tokens, the group and name from the run dir)."""

from __future__ import annotations

import contextlib
import io
import tomllib
from pathlib import Path

import pytest

from slurmrl import cli
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.roles import wandb_settings
from slurmrl.runtime.steps.probe import environment_problems

ROOT = Path(__file__).resolve().parent.parent
RL = ROOT / "recipes" / "rl-debug.toml"


def render(tmp_path: Path, overrides: list[str], recipe: Path = RL) -> tuple[int, str, Path]:
    run_dir = tmp_path / "run"
    argv = ["render", str(recipe), "--run-dir", str(run_dir)]
    for o in overrides:
        argv += ["--set", o]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, err.getvalue(), run_dir


BAD = [
    # [eval]
    (["eval.every=0"], "eval.every"),
    (["eval.every=-3"], "eval.every"),
    (["eval.every=2.5"], "eval.every"),
    (["eval.every='5'"], None),  # a numeric string is its number, as in every section
    (["eval.every=21"], "eval.every"),  # more than trainer.max_steps (20): it would never run
    (["eval.prompts=4"], "eval.every"),  # a table without its required every
    (["eval.every=2", "eval.prompts=0"], "eval.prompts"),
    (["eval.every=2", "eval.samples_per_prompt=0"], "eval.samples_per_prompt"),
    (["eval.every=2", "eval.samples_per_prompt=4"], "eval.samples_per_prompt"),  # greedy: 4 identical samples
    (["eval.every=2", "eval.temperature=-0.5"], "eval.temperature"),
    (["eval.every=2", "eval.temperature=nan"], "eval.temperature"),
    (["eval.every=2", "eval.max_tokens=0"], "eval.max_tokens"),
    (["eval.every=2", "eval.heldout_fraction=0"], "eval.heldout_fraction"),
    (["eval.every=2", "eval.heldout_fraction=0.9"], "eval.heldout_fraction"),
    (["eval.every=2", "eval.at_start='maybe'"], "eval.at_start"),
    (["eval.every=2", "eval.greedy=true"], "eval.greedy"),  # unknown key
    (["eval.every=2", "eval.environment='nope'"], "eval.environment"),
    (["eval.every=2", "eval.environment='arithmetic'", "eval.environment_args.foo=1"], "eval.environment_args.foo"),
    (["eval.every=2", "eval.environment='arithmetic'", "eval.environment_args.few_shot='2'"],
     "eval.environment_args.few_shot"),
    (["eval.every=2", "eval.environment='arithmetic'", "eval.environment_args.few_shot=-1"], "eval.environment_args"),
    (["eval.every=2", "eval.environment_args.few_shot=1"], "eval.environment_args"),  # without eval.environment
    (["eval.every=2", "eval.environment='arithmetic'", "eval.heldout_fraction=0.2"], "eval.heldout_fraction"),
    (["eval.every=2", "eval.correct_at=inf"], "eval.correct_at"),
    (["eval.every=2", "eval.seed=-1"], "eval.seed"),
    (["eval=3"], "eval"),
    # [wandb]
    (["wandb.project=''"], "wandb.project"),
    (["wandb.project='  '"], "wandb.project"),
    (["wandb.project='team/proj'"], "wandb.project"),
    (["wandb.project='a#b'"], "wandb.project"),
    (["wandb.project='" + "p" * 129 + "'"], "wandb.project"),
    (["wandb.project=3"], None),  # a number means its text (coerce_numbers_to_str): accepted
    (["wandb.entity='my team'"], "wandb.entity"),
    (["wandb.entity=''"], "wandb.entity"),
    (["wandb.group='a:b'"], "wandb.group"),
    (["wandb.group='line\\nbreak'"], "wandb.group"),
    (["wandb.name=''"], "wandb.name"),
    (["wandb.tags='rl'"], "wandb.tags"),
    (["wandb.tags=['rl', 'rl']"], "wandb.tags"),
    (["wandb.tags=['']"], "wandb.tags.0"),
    (["wandb.tags=['" + "t" * 65 + "']"], "wandb.tags.0"),
    (["wandb.tags=[" + ", ".join(f"'t{i}'" for i in range(65)) + "]"], "wandb.tags"),
    (["wandb.mode='shared'"], "wandb.mode"),
    (["wandb.api_key='abc'"], "wandb.api_key"),  # the key comes from the environment only
    (["wandb.key='abc'"], "wandb.key"),
    (["wandb.run_id='x'"], "wandb.run_id"),
]


@pytest.mark.parametrize("overrides,field", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_values_are_one_line_naming_the_field(tmp_path, overrides, field):
    rc, err, run_dir = render(tmp_path, overrides)
    if field is None:
        assert rc == 0, err
        return
    assert rc == 2 and not run_dir.exists(), err
    assert len(err.splitlines()) == 1 and err.startswith(f"slurmrl: error: {field}: "), err
    assert "Traceback" not in err and "abc" not in err  # the would-be key is not echoed


def test_eval_outside_kind_rl_and_wandb_in_kind_inference_are_refused(tmp_path):
    rc, err, _ = render(tmp_path, ["eval.every=1"], ROOT / "recipes" / "sft-debug.toml")
    assert rc == 2 and err.startswith("slurmrl: error: eval: is not used by kind 'sft'"), err
    rc, err, _ = render(tmp_path, ["wandb.project='x'"], ROOT / "recipes" / "inference-debug.toml")
    assert rc == 2 and err.startswith("slurmrl: error: wandb: kind 'inference' runs no trainer"), err
    rc, err, _ = render(tmp_path, ["wandb.project='x'"], ROOT / "recipes" / "sft-debug.toml")
    assert rc == 0, err  # the SFT trainer logs to W&B too


def components(run_dir: Path) -> tuple[dict, dict]:
    read = lambda name: tomllib.loads((run_dir / "components" / f"{name}.toml").read_text())  # noqa: E731
    return read("orchestrator"), read("trainer")


def test_eval_and_wandb_reach_both_programs_resolved(tmp_path):
    rc, err, run_dir = render(tmp_path, ["eval.every=5", "wandb.project='rl-exp'", "wandb.entity='my-team'",
                                         "wandb.tags=['smoke', 'reverse']", "wandb.mode='offline'"])
    assert rc == 0, err
    orch, trainer = components(run_dir)
    assert orch["eval"] == {"every": 5, "at_start": True, "environment": "reverse_text", "environment_args": {},
                            "heldout_fraction": 0.1, "prompts": 32, "samples_per_prompt": 1, "temperature": 0.0,
                            "max_tokens": 8, "correct_at": 1.0, "seed": 0, "heldout": True}
    want = {"project": "rl-exp", "entity": "my-team", "group": "run", "name": "run", "tags": ["smoke", "reverse"],
            "mode": "offline"}
    assert orch["wandb"] == want and trainer["wandb"] == want  # one group: the run dir's name


def test_eval_on_another_environment_and_user_group_name(tmp_path):
    rc, err, run_dir = render(tmp_path, [
        "eval.every=4", "eval.environment='arithmetic'", "eval.environment_args={ few_shot = 2 }",
        "eval.samples_per_prompt=4", "eval.temperature=0.7", "eval.max_tokens=3",
        "wandb.group='sweep-7'", "wandb.name='lr-2e-3'"])
    assert rc == 0, err
    orch, trainer = components(run_dir)
    e = orch["eval"]
    assert (e["environment"], e["environment_args"], e["heldout"], e["max_tokens"]) == ("arithmetic", {"few_shot": 2},
                                                                                          False, 3)
    assert orch["wandb"]["group"] == trainer["wandb"]["group"] == "sweep-7"
    assert orch["wandb"]["name"] == trainer["wandb"]["name"] == "lr-2e-3"
    assert "mode" not in orch["wandb"] or orch["wandb"]["mode"] is None  # the job's WANDB_MODE, else offline


def test_without_tables_nothing_changes(tmp_path):
    rc, err, run_dir = render(tmp_path, [])
    assert rc == 0, err
    orch, trainer = components(run_dir)
    assert "eval" not in orch
    assert orch["wandb"] == trainer["wandb"] == {"project": "slurmrl", "group": "run", "name": "run", "tags": []}


@pytest.mark.parametrize(("leaf", "group"), [("exp?v2:a#1", "exp_v2_a_1"), ("50%", "50_"), ("x" * 200, "x" * 128)])
def test_the_default_group_is_the_run_dirs_name_in_a_form_wandb_takes(tmp_path, leaf, group):
    """A run dir is a path: characters W&B refuses in a group or run name become "_", never an error."""
    recipe = load_recipe(Path(__file__).resolve().parent.parent / "recipes" / "rl-debug.toml")
    w = wandb_settings(recipe, str(tmp_path / leaf))
    assert (w.group, w.name) == (group, group)


def test_the_preflight_probe_loads_eval_environment_where_the_job_would(tmp_path, monkeypatch):
    """`submit --preflight` loads a custom eval.environment on the node, beside the training one: a
    class the job's Python cannot import is named there, before any server starts."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "evalenv.py").write_text("from slurmrl.envs.arithmetic import Arithmetic as Good\n")
    monkeypatch.syspath_prepend(str(pkg))
    for env, problems in (("evalenv:Good", []), ("evalenv:Missing", ["eval.environment: cannot load environment"]),
                          ("gone_module:Env", ["eval.environment: cannot load environment"])):
        rc, err, run_dir = render(tmp_path / env.replace(":", "_"), ["eval.every=2", f"eval.environment='{env}'"])
        assert rc == 0, err
        found = environment_problems(run_dir)
        assert [p[:len(want)] for p, want in zip(found, problems)] == problems and len(found) == len(problems), found
