"""The layer table, read from the code with `ast` (imports inside functions included): each module
imports only layers below its own, no two modules import each other in a cycle, imports inside
functions stay few. Plan and runtime share only leaves (the port table, the environments, the run-dir layout,
the settings models): neither imports the other, the supervisor starts without pydantic, and
runtime/ imports nothing above it (read from the source with ``ast``, imports in functions too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("module", ["slurmrl.runtime.steps.supervise", "slurmrl.runtime.steps.probe"])
def test_step_programs_import_no_planner_and_no_pydantic(module):
    mods = loaded_after(module)
    assert not {m for m in mods if m.startswith(("slurmrl.plan", "slurmrl.render", "slurmrl.recipe", "pydantic"))}


def test_the_contract_imports_only_the_standard_library():
    """Step wrappers start without pydantic: every contract module loads with nothing heavy, and the
    contract imports nothing of slurmrl but itself."""
    names = sorted(f"slurmrl.contract.{p.stem}" for p in (ROOT / "slurmrl" / "contract").glob("*.py")
                   if p.stem != "__init__")
    assert "slurmrl.contract.job_env" in names
    mods = loaded_after(", ".join(names))
    assert not {m for m in mods if m.split(".")[0] in ("pydantic", "torch", "jinja2", "tomlkit", "vllm")}
    assert {m for m in mods if m.startswith("slurmrl")} == {"slurmrl", "slurmrl.contract", *names}


def test_planner_imports_no_runtime():
    mods = loaded_after("slurmrl.plan")
    assert not {m for m in mods if m.startswith("slurmrl.runtime")}
    assert {"slurmrl.ports", "slurmrl.envs"} <= mods


# ---- runtime/: what runs inside job steps imports only what it reads, never the planner's side ----
RUNTIME = ROOT / "slurmrl" / "runtime"
RUNTIME_MAY_IMPORT = ("slurmrl.runtime", "slurmrl.contract", "slurmrl.settings", "slurmrl.rundir", "slurmrl.charts", "slurmrl.envs",
                      "slurmrl.ports", "slurmrl.secret", "slurmrl.heartbeat", "slurmrl.errors")


def first_party_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every slurmrl import in ``path``, those inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "slurmrl":
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "slurmrl" else [node.module]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "slurmrl"]
    return out


def test_runtime_imports_only_settings_rundir_and_leaves():
    bad = [f"{p.relative_to(ROOT)}:{line}: {mod}" for p in sorted(RUNTIME.rglob("*.py"))
           for line, mod in first_party_imports(p)
           if not any(mod == ok or mod.startswith(ok + ".") for ok in RUNTIME_MAY_IMPORT)]
    assert not bad, "runtime/ imports recipe/plan/render/slurm/app (move the piece down):\n" + "\n".join(bad)


def test_fixtures_are_not_part_of_a_job():
    users = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(RUNTIME.rglob("*.py"))
             if "fixtures" not in p.parts for line, mod in first_party_imports(p) if ".fixtures" in mod]
    assert not users


def test_only_the_vllm_client_speaks_http_to_vllm():
    """One client for vLLM's routes (secret, timeouts, errors in one place); the auth gate is a proxy (aiohttp)."""
    speakers = sorted(str(p.relative_to(RUNTIME)) for p in RUNTIME.rglob("*.py")
                      if any(w in p.read_text() for w in ("import urllib.request", "import http.client")))
    assert speakers == ["vllm/client.py"]


# ---- the layer table (docs/design.md "Layers"): every module, imports inside functions included ----
PACKAGE = ROOT / "slurmrl"

# low to high; a module may import from a strictly lower layer, or within its own top-level unit
LAYERS: list[set[str]] = [
    {"errors", "contract"},
    {"ports", "secret", "heartbeat", "envs", "pydantic_plugins", "rundir", "localcluster", "charts", "toml_errors"},
    {"settings"},
    {"recipe", "runtime"},
    {"plan"},
    {"render", "slurm"},
    {"remote"},
    {"app"},
    {"cli"},
    {"__main__"},
]
LEVEL = {unit: i for i, units in enumerate(LAYERS) for unit in units}
# a leaf imports the standard library, errors and the contract only (the contract: nothing of slurmrl)
ONLY_ERRORS = {"rundir", "errors", "ports", "toml_errors"}
LEAF_MAY_IMPORT = {"errors", "contract"}
MAX_INNER_IMPORTS = 15


def modules() -> dict[str, Path]:
    found = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = f
    return found


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(mods: dict[str, Path]) -> list[tuple[str, str, bool, int]]:
    """(importer, imported module, inside a function, line) for every first-party import."""
    out = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        inner = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(fn)}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t.startswith("slurmrl") and t != name and unit(t):
                    out.append((name, t, id(node) in inner, node.lineno))
    return out


MODS = modules()
EDGES = imports(MODS)


def test_every_unit_has_a_layer():
    assert {unit(m) for m in MODS if unit(m)} - set(LEVEL) == set()


def test_imports_go_down_the_layers():
    wrong = []
    for a, b, _, line in EDGES:
        ua, ub = unit(a), unit(b)
        if ua == ub:
            continue
        if LEVEL[ub] >= LEVEL[ua] or (ua in ONLY_ERRORS and ub not in LEAF_MAY_IMPORT):
            wrong.append(f"{MODS[a].relative_to(PACKAGE.parent)}:{line} {a} -> {b}")
    assert wrong == []


def test_no_import_cycles_between_modules():
    graph = defaultdict(set)
    for a, b, _, _ in EDGES:
        graph[a].add(b)
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def strong(v):  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            # a package's __init__ importing its own submodules is not a cycle of concern
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(MODS):
        if v not in index:
            strong(v)
    assert cycles == []


def test_few_imports_inside_functions():
    """Each first-party import statement inside a function is there for start-up time (jinja2 off
    `slurmrl plan`, torch off the trainer's argument parsing, an environment's own model)."""
    inner = sorted({f"{MODS[a].relative_to(PACKAGE.parent)}:{line}" for a, b, fn, line in EDGES if fn})
    assert len(inner) <= MAX_INNER_IMPORTS, "\n".join(inner)
