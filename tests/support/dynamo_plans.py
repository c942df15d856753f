"""Dynamo recipes rendered and expanded: the tasks, their ports and argv; shared by the Dynamo plan tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from task_expand import JOB_ID, expand

from slurmrl import ports
from slurmrl.app.build import Rendered, build
from slurmrl.rundir import tomlw

ROOT = Path(__file__).resolve().parents[2]


RECIPES = ROOT / "recipes"


DYNAMO_PY = ROOT / ".venv-dynamo" / "bin" / "python"


def base(**inference) -> dict:
    d = {
        "name": "dyn", "kind": "inference", "slurm": {"gpus_per_node": 4, "cpus_per_node": 32},
        "model": {"path": "/models/m", "served_name": "m"},
        "inference": {"backend": "dynamo", "auth": "none", "dynamo": {"engine": "mocker"}},
    }
    for k, v in inference.items():
        if isinstance(v, dict) and isinstance(d["inference"].get(k), dict):
            d["inference"][k] = {**d["inference"][k], **v}
        else:
            d["inference"][k] = v
    return d


def render(tmp_path: Path, recipe: dict | Path, overrides: list[str] = ()) -> Rendered:
    if isinstance(recipe, dict):
        path = tmp_path / "recipe.toml"
        path.write_text(tomlw.dumps(recipe))
        recipe = path
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return build(recipe, list(overrides), run_dir=run_dir)


def tasks(out: Rendered, name: str):
    c = out.plan.component(name)
    return [(i, expand(out.script, out.plan, name, i.node, i.local)) for i in c.instances]


def port(out: Rendered, name: str) -> int:
    return ports.base_for_job(JOB_ID) + out.plan.ports[name]


def srun(c) -> list[str]:
    return [a if isinstance(a, str) else a.sh for a in c.srun]


TRTLLM_STUB = """
import collections, sys, types
m, l = types.ModuleType("tensorrt_llm"), types.ModuleType("tensorrt_llm.llmapi")
class BuildConfig:  # only its defaults are read by the parser
    model_fields = collections.defaultdict(lambda: types.SimpleNamespace(default=None))
l.BuildConfig, m.llmapi = BuildConfig, l
sys.modules.update({"tensorrt_llm": m, "tensorrt_llm.llmapi": l})
"""


PARSERS = TRTLLM_STUB + r"""
import argparse, contextlib, io, json, sys

def trtllm(argv):
    from dynamo.trtllm.args import parse_args
    parse_args(argv)

def mocker(argv):
    from dynamo.mocker.args import parse_args
    parse_args(argv)

def frontend(argv):
    from dynamo.frontend.main import parse_args
    sys.argv = ["dynamo.frontend", *argv]
    parse_args()

def vllm(argv):  # Dynamo's own groups; what is left must be vLLM engine arguments (checked in .venv)
    from dynamo.common.configuration.groups.runtime_args import DynamoRuntimeArgGroup
    from dynamo.vllm.backend_args import DynamoVllmArgGroup
    p = argparse.ArgumentParser(allow_abbrev=False)
    DynamoRuntimeArgGroup().add_arguments(p)
    DynamoVllmArgGroup().add_arguments(p)
    return p.parse_known_args(argv)[1]

out = []
for module, argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            left = globals()[module.removeprefix("dynamo.")](argv)
        out.append({"ok": True, "left": left})
    except SystemExit as e:
        out.append({"ok": not e.code, "error": err.getvalue()[-1500:]})
    except Exception as e:
        out.append({"ok": False, "error": repr(e) + err.getvalue()[-1500:]})
print(json.dumps(out))
"""


def dynamo_python() -> str:
    if not DYNAMO_PY.exists():
        pytest.fail(f"{DYNAMO_PY} is missing: run scripts/install.sh", pytrace=False)
    return str(DYNAMO_PY)


def parse(lines: list[tuple[str, list[str]]]) -> list[dict]:
    """Each (module, argv) through that module's own parser, in one .venv-dynamo process."""
    r = subprocess.run([dynamo_python(), "-c", PARSERS], input=json.dumps(lines), capture_output=True, text=True,
                       timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def engine_argv(e) -> tuple[str, list[str]]:
    cmd = e.command
    i = cmd.index("-m")
    return cmd[i + 1], cmd[i + 2:]
