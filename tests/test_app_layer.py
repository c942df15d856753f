"""The verbs' floor (issue 22 item 1): one module per user verb under slurmrl/app/, imported only by
cli.py; slurm/ and render/ never reach up into it; no first-party import inside a function in app/,
slurm/, render/ or cli.py except those that keep jinja2 off the `plan` path (marked by a comment);
`slurmrl plan` loads neither jinja2 nor the Slurm adapter. Read with `ast`, imports inside functions
included."""

from __future__ import annotations

import argparse
import ast
import importlib
import subprocess
import sys
from pathlib import Path

from slurmrl import cli

PKG = Path(__file__).resolve().parent.parent / "slurmrl"


def imports(path: Path) -> list[tuple[str, bool, str]]:
    """(module, inside a function, the source line) of every first-party import in ``path``."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] == "slurmrl":
                out.append((name, id(node) in inner, lines[node.lineno - 1]))
    return out


def rel(path: Path) -> str:
    return path.relative_to(PKG.parent).as_posix()


def test_only_cli_imports_the_verbs_and_the_adapter_never_reaches_up():
    for path in PKG.rglob("*.py"):
        if path.parent.name == "app":
            continue
        reaching = [name for name, _, _ in imports(path) if name.startswith("slurmrl.app")]
        assert not reaching, f"{rel(path)} imports {reaching}: only cli.py may import slurmrl.app"


def test_no_first_party_import_inside_a_function_but_for_start_up_time():
    files = [PKG / "cli.py", *(PKG / "app").glob("*.py"), *(PKG / "slurm").glob("*.py"), *(PKG / "render").glob("*.py")]
    for path in files:
        for name, inner, line in imports(path):
            assert not inner or "jinja2" in line, f"{rel(path)}: {line.strip()} (an import inside a function)"


def test_every_verb_has_its_module_and_handler():
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(cli.VERBS)
    for verb, module in cli.VERBS.items():
        assert callable(getattr(importlib.import_module(f"slurmrl.app.{module}"), f"cmd_{verb}"))


def test_plan_loads_neither_jinja2_nor_the_slurm_adapter():
    code = ("import sys\nfrom slurmrl import cli\nimport slurmrl.app.build\n"
            "print('\\n'.join(sorted(sys.modules)))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert not {m for m in mods if m.split(".")[0] in ("jinja2", "torch", "vllm", "matplotlib")}
    assert not {m for m in mods if m.startswith(("slurmrl.slurm", "slurmrl.remote", "slurmrl.runtime"))}
