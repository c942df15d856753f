"""The engines' own argument parsers for rendered SGLang command lines, each run in the Python that
imports it (none of them installs beside vLLM's CPU build in .venv):

- ``sglang.launch_server``: sglang 0.5.23's ``ServerArgs`` (.venv-sglang, scripts/install.sh).
- ``dynamo.sglang``: Dynamo 1.4.2's own parse (``dynamo.sglang.args``: its runtime and SGLang groups,
  then SGLang's ``ServerArgs`` on what is left), from .venv-dynamo's site-packages read by
  .venv-sglang's Python. Dynamo 1.4.2 pins sglang 0.5.16, which needs torchvision's CUDA build to
  import here; 0.5.23 moved ``sglang.srt.server_args_config_parser`` to ``sglang.srt.utils``, so
  the check aliases that one module name (nothing of the parse is replaced).
- ``sglang_router.launch_router``: sglang-router's ``parse_router_args`` (pip-installs on CPU).

``SLURMRL_SGLANG_PYTHON``, ``SLURMRL_DYNAMO_SITE`` and ``SLURMRL_SGLANG_ROUTER_PYTHON`` name others;
where one does not import, the test that needs it is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PY = os.environ.get("SLURMRL_SGLANG_PYTHON", str(ROOT / ".venv-sglang" / "bin" / "python"))
DYNAMO_SITE = os.environ.get("SLURMRL_DYNAMO_SITE", str(ROOT / ".venv-dynamo" / "lib" / "python3.11" / "site-packages"))
ROUTER_PY = os.environ.get("SLURMRL_SGLANG_ROUTER_PYTHON", SGLANG_PY)

SERVER = r"""
import argparse, json, sys
import sglang
from sglang.srt.server_args import ServerArgs
out = []
for argv in json.loads(sys.stdin.read()):
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(p)
    ns = p.parse_args(argv)
    ServerArgs.from_cli_args(ns)
    out.append({k: v for k, v in vars(ns).items() if isinstance(v, (int, float, str, bool, type(None)))})
print(json.dumps({"version": sglang.__version__, "parsed": out}))
"""

# dynamo.sglang.args.parse_args up to ServerArgs, without its model download and model-config read
DYNAMO = r"""
import argparse, importlib, json, sys
sys.path.append(sys.argv[1])
import sglang
sys.modules["sglang.srt.server_args_config_parser"] = importlib.import_module("sglang.srt.utils.server_args_config_parser")
from dynamo.sglang import args as A
from dynamo.sglang._version import __version__ as dynamo_version
from dynamo.common.configuration.groups.runtime_args import DynamoRuntimeArgGroup
from sglang.srt.server_args import ServerArgs
out = []
for argv in json.loads(sys.stdin.read()):
    parser = argparse.ArgumentParser()
    DynamoRuntimeArgGroup().add_arguments(parser)
    A.DynamoSGLangArgGroup().add_arguments(parser)
    ns, unknown = parser.parse_known_args(argv)
    config = A.DynamoConfig.from_cli_args(ns)
    config.validate()
    sp = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(sp)
    sa = sp.parse_args(unknown)
    ServerArgs.from_cli_args(sa)
    both = {**vars(ns), **vars(sa)}
    out.append({k: v for k, v in both.items() if isinstance(v, (int, float, str, bool, type(None)))})
print(json.dumps({"version": dynamo_version, "sglang": sglang.__version__, "parsed": out}))
"""

ROUTER = r"""
import dataclasses, json, sys
from sglang_router.launch_router import parse_router_args
from sglang_router.version import __version__
out = []
for argv in json.loads(sys.stdin.read()):
    a = parse_router_args(argv)
    a._validate_router_args()
    out.append({k: v for k, v in dataclasses.asdict(a).items() if isinstance(v, (int, float, str, bool, list, type(None)))})
print(json.dumps({"version": __version__, "parsed": out}, default=str))
"""


def _python(py: str, probe: str, what: str, extra: tuple[str, ...] = ()) -> str:
    ok = Path(py).exists() and subprocess.run([py, "-c", probe, *extra], capture_output=True, timeout=300,
                                              cwd="/").returncode == 0
    if not ok:
        pytest.skip(f"no {what} parser: {py} cannot import it (tests/support/sglang_parsers.py says where each installs)")
    return py


def _run(py: str, script: str, argvs: list[list[str]], extra: tuple[str, ...] = ()) -> dict:
    r = subprocess.run([py, "-c", script, *extra], input=json.dumps(argvs), capture_output=True, text=True,
                       timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def parse_servers(argvs: list[list[str]]) -> dict:
    py = _python(SGLANG_PY, "import sglang.srt.server_args", "SGLang server-args")
    return _run(py, SERVER, argvs)


def parse_dynamo(argvs: list[list[str]]) -> dict:
    probe = "import sys; sys.path.append(sys.argv[1]); import sglang.srt.server_args, dynamo.sglang"
    if not Path(DYNAMO_SITE).is_dir():
        pytest.skip(f"no dynamo.sglang parser: {DYNAMO_SITE} is not a site-packages with ai-dynamo 1.4.2")
    py = _python(SGLANG_PY, probe, "dynamo.sglang", (DYNAMO_SITE,))
    return _run(py, DYNAMO, argvs, (DYNAMO_SITE,))


def parse_router(argvs: list[list[str]]) -> dict:
    py = _python(ROUTER_PY, "import sglang_router.launch_router", "sglang-router")
    return _run(py, ROUTER, argvs)


def given(argv: list[str]) -> dict[str, str]:
    """``--flag VALUE`` pairs of an argv, by argparse's dest."""
    return {flag.removeprefix("--").replace("-", "_"): argv[j + 1]
            for j, flag in enumerate(argv[:-1]) if flag.startswith("--") and not argv[j + 1].startswith("--")}
