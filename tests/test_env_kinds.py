"""Environments' declared kinds in the recipe: a chat-only setting (``slurmrl.envs.protocol.CHAT_ONLY``) the
user sets does nothing for a text environment, so `validate` refuses it for a built-in one (one line naming
the field, exit 2) and the preflight probe, which loads a custom one on the node, refuses it there. Defaults
are never refused; a chat environment anywhere in the job (training or [eval]) takes them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from slurmrl import cli
from slurmrl.app.plan import planned
from slurmrl.envs.protocol import CHAT_ONLY
from slurmrl.errors import UserError
from slurmrl.runtime.steps.probe import environment_problems

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "slurmrl" / "recipes"
CHAT_ONLY_VALUES = {"orchestrator.max_turns": "3", "orchestrator.max_rollout_tokens": "300",
                    "orchestrator.env_timeout_s": "5.0", "inference.tool_call_parser": "'hermes'"}


def test_every_chat_only_field_has_a_value_here():
    assert set(CHAT_ONLY_VALUES) == set(CHAT_ONLY)


@pytest.mark.parametrize("field", sorted(CHAT_ONLY))
def test_validate_refuses_a_chat_only_setting_on_a_built_in_text_environment(field):
    r = subprocess.run([sys.executable, "-m", "slurmrl", "validate", str(RECIPES / "rl-debug.toml"),
                        "--set", f"{field}={CHAT_ONLY_VALUES[field]}"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"slurmrl: error: {field}: only applies to a chat environment's conversations; "
                        "orchestrator.environment 'reverse_text' is a text environment (one completion per prompt): "
                        "remove the setting\n")


@pytest.mark.parametrize("overrides", [
    ["orchestrator.max_turns=8"],  # the default, written out: set by the user all the same
    ["orchestrator.environment='arithmetic'", "orchestrator.env_timeout_s=30.0"],
    ["eval.every=2", "eval.environment='arithmetic'", "orchestrator.max_rollout_tokens=64"],
])
def test_set_is_refused_whatever_its_value_and_however_many_text_environments(overrides):
    with pytest.raises(UserError, match="only applies to a chat environment") as e:
        planned(RECIPES / "rl-debug.toml", overrides, run_dir="/runs/x")
    assert e.value.field == next(o.split("=")[0] for o in overrides if o.split("=")[0] in CHAT_ONLY)


@pytest.mark.parametrize("recipe, overrides", [
    ("rl-debug", []),  # the defaults: never refused
    ("rl-guess-number", ["orchestrator.max_turns=3", "orchestrator.env_timeout_s=5.0"]),  # a chat environment
    ("rl-debug", ["eval.every=2", "eval.environment='guess_number'", "orchestrator.max_turns=3"]),  # [eval]'s is chat
    ("rl-debug", ["orchestrator.environment='verifiers:some-env'", "orchestrator.max_turns=3"]),  # always chat
    ("rl-debug", ["orchestrator.environment='my_envs.game:Game'", "orchestrator.max_turns=3"]),  # known on the node
])
def test_chat_only_settings_pass_where_an_environment_may_be_chat(recipe, overrides):
    planned(RECIPES / f"{recipe}.toml", overrides, run_dir="/runs/x")


KINDS_PY = '''
from slurmrl.envs.arithmetic import Arithmetic as Text
from slurmrl.envs.guess_number import GuessNumber as Chat


class NoKind:
    def prompts(self, rng, n):
        return []

    def reward(self, task, completion):
        return 0.0
'''


def render(tmp_path: Path, overrides: list[str], recipe: Path = RECIPES / "rl-debug.toml") -> Path:
    run_dir = tmp_path / "run"
    argv = ["render", str(recipe), "--run-dir", str(run_dir)]
    for o in overrides:
        argv += ["--set", o]
    assert cli.main(argv) == 0
    return run_dir


@pytest.mark.parametrize("env, overrides, problem", [
    ("kinds_env:Text", ["orchestrator.max_turns=3"], "orchestrator.max_turns: only applies to a chat environment's "
     "conversations; orchestrator.environment 'kinds_env:Text' is a text environment (one completion per prompt): "
     "remove the setting"),
    ("kinds_env:Text", ["eval.every=2", "eval.environment='kinds_env:Text'", "inference.tool_call_parser='hermes'"],
     "inference.tool_call_parser: only applies to a chat environment's conversations; orchestrator.environment "
     "'kinds_env:Text' and eval.environment 'kinds_env:Text' are text environments (one completion per prompt): "
     "remove the setting"),
    ("kinds_env:Text", [], None),
    ("kinds_env:Chat", ["orchestrator.max_turns=3"], None),
    ("kinds_env:Text", ["eval.every=2", "eval.environment='kinds_env:Chat'", "orchestrator.max_turns=3"], None),
    ("kinds_env:NoKind", [], "orchestrator.environment: environment 'kinds_env:NoKind' (NoKind) declares no kind: "
     'give its class kind = "text" (prompt text) or kind = "chat" (messages)'),
])
def test_the_preflight_refuses_a_chat_only_setting_on_a_custom_text_environment(tmp_path, monkeypatch, env, overrides,
                                                                                 problem):
    (tmp_path / "kinds_env.py").write_text(KINDS_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = render(tmp_path, [f"orchestrator.environment='{env}'", *overrides])
    settings = tomllib.loads((run_dir / "components" / "orchestrator.toml").read_text())
    assert settings["chat_only_set"] == [o.split("=")[0] for o in overrides if o.split("=")[0] in CHAT_ONLY]
    assert environment_problems(run_dir) == ([problem] if problem else [])


def test_a_chat_only_setting_at_its_default_is_written_as_a_resolved_recipe_tells_it(tmp_path, monkeypatch):
    """components/orchestrator.toml lists the chat-only fields set to other values than their defaults: what
    the run dir's recipe.toml (every default written out) still tells as set, so a re-render of it (`slurmrl
    diff`, `submit --again`) writes the same file. The planner refuses a built-in text environment's whatever
    the value (test_set_is_refused_whatever_its_value_and_however_many_text_environments)."""
    (tmp_path / "kinds_env.py").write_text(KINDS_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = render(tmp_path, ["orchestrator.environment='kinds_env:Text'", "orchestrator.max_turns=8",
                                "orchestrator.env_timeout_s=9.0"])
    settings = tomllib.loads((run_dir / "components" / "orchestrator.toml").read_text())
    assert settings["chat_only_set"] == ["orchestrator.env_timeout_s"]
    again = render(tmp_path / "again", [], run_dir / "recipe.toml")
    assert (again / "components" / "orchestrator.toml").read_text() == \
        (run_dir / "components" / "orchestrator.toml").read_text().replace(str(run_dir), str(again))
