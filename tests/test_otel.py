"""OTEL: ``OTEL_*`` from the recipe's [env] or from the environment the recipe is rendered in reach
every step (exported in job.sbatch) and vLLM's ``--otlp-traces-endpoint`` (which vLLM 0.32's own
parser takes); with none set, nothing about OTEL is rendered."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from task_expand import expand

from slurmrl.app.build import build

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
ENDPOINT = "http://otel-collector:4317"


@pytest.fixture(autouse=True)
def no_otel(monkeypatch):
    import os

    for k in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(k)


def render(recipe: str, sets: list[str]):
    """Rendered in memory; the run dir (where the script's prologue writes its secret) stays for ``expand``."""
    return build(RECIPES / f"{recipe}.toml", sets, run_dir=tempfile.mkdtemp(prefix="otel-"))


def test_nothing_is_rendered_without_otel():
    out = render("rl-judge", [])
    assert "otlp" not in out.script and "OTEL_" not in out.script
    assert "OTEL_" not in out.files["recipe.toml"]


def test_the_recipe_s_endpoint_reaches_every_step_and_vllm():
    out = render("rl-judge", [f'env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="{ENDPOINT}"', 'env.OTEL_SERVICE_NAME="rl"'])
    assert f"export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={ENDPOINT}\n" in out.script  # every step's environment
    assert "export OTEL_SERVICE_NAME=rl\n" in out.script
    for name in ("inference", "judge"):
        cmd = list(out.plan.component(name).task.command)
        assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == ENDPOINT, name
    assert "--otlp-traces-endpoint" not in out.plan.component("orchestrator").task.command


def test_the_environment_s_otel_joins_the_recipe_and_the_recipe_wins(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    out = render("rl-debug", ['env.OTEL_SERVICE_NAME="from-recipe"'])
    assert f"export OTEL_EXPORTER_OTLP_ENDPOINT={ENDPOINT}\n" in out.script
    assert "export OTEL_SERVICE_NAME=from-recipe\n" in out.script and "from-env" not in out.script
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in out.files["recipe.toml"]  # written down, so `diff` and `again` see it
    cmd = expand(out.script, out.plan, "inference", 0).command
    assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == ENDPOINT


VLLM_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
argv = json.load(sys.stdin)
args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
validate_parsed_serve_args(args)
print(json.dumps({"otlp": AsyncEngineArgs.from_cli_args(args).otlp_traces_endpoint}))
"""


@pytest.mark.vllm
def test_vllm_s_own_parser_takes_the_rendered_flag(vllm_python):
    out = render("rl-debug", [f'env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="{ENDPOINT}"'])
    cmd = expand(out.script, out.plan, "inference", 0).command
    p = vllm_python.run(VLLM_PARSE, input=json.dumps(cmd[cmd.index("vllm.entrypoints.openai.api_server") + 1:]))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"otlp": ENDPOINT}
