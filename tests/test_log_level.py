"""[log] level: the variables each engine and library reads, exported in the script's header, and a
recipe that sets one of them itself refused, naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl.errors import UserError
from slurmrl.plan import log_env, plan
from slurmrl.recipe.load import apply_overrides, read_toml, validate
from slurmrl.render.script import render_script

ROOT = Path(__file__).resolve().parent.parent
RL = ROOT / "slurmrl" / "recipes" / "rl-debug.toml"


def planned(*sets: str):
    return plan(validate(apply_overrides(read_toml(RL), list(sets))), "/runs/x")


def test_info_exports_nothing_and_debug_exports_every_variable_in_the_header():
    assert not set(planned().env) & set(log_env.LEVELS["debug"])
    p = planned('log.level="debug"')
    assert {k: p.env[k] for k in log_env.LEVELS["debug"]} == log_env.LEVELS["debug"]
    script = render_script(p, "/runs/x", str(RL))
    header = script.split("task_")[0]  # before the first component's function: every step inherits it
    for name, value in log_env.LEVELS["debug"].items():
        assert f"export {name}={value}" in header


@pytest.mark.parametrize("field", ["env", "trainer.env", "inference.env", "orchestrator.env"])
def test_a_variable_set_twice_is_refused_naming_the_field(field):
    with pytest.raises(UserError) as e:
        planned('log.level="warning"', f'{field}={{NCCL_DEBUG="INFO"}}')
    assert e.value.field == field and "NCCL_DEBUG" in e.value.message and "log.level" in e.value.message
    planned(f'{field}={{NCCL_DEBUG="INFO"}}')  # at the default level nothing is exported: no clash


@pytest.mark.vllm
def test_vllm_reads_the_variable_the_planner_exports_for_it():
    """The name is vLLM's own (its table of environment variables), and it reads the value we write."""
    code = ("import vllm.envs as e; import sys; "
            "assert 'VLLM_LOGGING_LEVEL' in e.environment_variables; print(e.VLLM_LOGGING_LEVEL)")
    for level in ("debug", "warning", "error"):
        value = log_env.LEVELS[level]["VLLM_LOGGING_LEVEL"]
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "VLLM_LOGGING_LEVEL": value},
                             capture_output=True, text=True, timeout=120, check=True).stdout
        assert out.strip().splitlines()[-1] == value


def test_sglang_servers_take_the_level_on_their_own_flag():
    """SGLang reads no logging variable: its servers get --log-level (parsed by SGLang's own parser in
    tests/test_sglang_plan.py); at the default level the flag is left out."""
    gallery = ROOT / "slurmrl" / "recipes" / "inference-sglang.toml"
    for level, want in (("info", None), ("warning", "warning")):
        p = plan(validate(apply_overrides(read_toml(gallery), [f'log.level="{level}"'])), "/runs/x")
        argv = [str(a) for c in p.components for a in c.task.command]
        assert ("--log-level" in argv) is (want is not None)
        if want:
            assert argv[argv.index("--log-level") + 1] == want
