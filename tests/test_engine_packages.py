"""A new engine touches its package and the two registries: read from the code with ``ast``.

Each policy engine (``slurmrl.recipe.inference.BACKENDS``) has its section in a module of its own
(``slurmrl/recipe/<engine>.py``) and its planning in one package (``slurmrl/plan/engines/<engine>/``).
No other module of slurmrl names the section's classes or imports the section's module, except the two
registries (``slurmrl/recipe/inference.py``, ``slurmrl/plan/engines/__init__.py``); no module outside
``plan/engines/`` imports an engine's package (engines may build on one another's command lines:
Dynamo's vLLM workers and the judge's servers speak vLLM's flags). Rules shared by engines ask a type
(``serving.Disaggregated``, ``router.Routed``), not whether a section has a field of some name."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurmrl.plan import engines
from slurmrl.recipe.inference import BACKENDS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slurmrl"
ENGINES_DIR = PACKAGE / "plan" / "engines"
REGISTRIES = {PACKAGE / "recipe" / "inference.py", ENGINES_DIR / "__init__.py"}


@dataclass(frozen=True)
class Engine:
    name: str
    section_module: str  # slurmrl.recipe.<engine>
    classes: frozenset[str]  # the classes that module defines: the section and its parts
    package: Path

    @property
    def plan_module(self) -> str:
        return f"slurmrl.plan.engines.{self.name}"


def engine(name: str, section: type) -> Engine:
    module = sys.modules[section.__module__]
    classes = frozenset(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
    return Engine(name, module.__name__, classes, ENGINES_DIR / name)


POLICY_ENGINES = [engine(name, section) for name, section in BACKENDS.items()]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import, ``from pkg import mod`` as ``pkg.mod`` too."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module_name(path).split(".")
                pkg = pkg if path.name == "__init__.py" else pkg[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            out += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def named(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, identifier) of every name, attribute and imported name."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def within(path: Path, folder: Path) -> bool:
    return folder == path.parent or folder in path.parents


SOURCES = {p: ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def trespasses(e: Engine, sources: dict[Path, ast.AST]) -> list[str]:
    own = {p for p in sources if within(p, e.package)} | {ROOT / (e.section_module.replace(".", "/") + ".py")}
    bad = []
    for path, tree in sources.items():
        if path in own or path in REGISTRIES:
            continue
        rel = path.relative_to(ROOT)
        for line, mod in imported(tree, path):
            if mod == e.section_module or mod.startswith(e.section_module + "."):
                bad.append(f"{rel}:{line}: imports {e.section_module}")
            elif (mod == e.plan_module or mod.startswith(e.plan_module + ".")) and not within(path, ENGINES_DIR):
                bad.append(f"{rel}:{line}: imports {e.plan_module}")
        bad += [f"{rel}:{line}: names {n}" for line, n in named(tree) if n in e.classes]
    return sorted(set(bad))


@pytest.mark.parametrize("e", POLICY_ENGINES, ids=lambda e: e.name)
def test_only_its_package_its_section_and_the_registries_name_an_engine(e):
    assert e.classes, e  # the section's module defines its classes
    bad = trespasses(e, SOURCES)
    assert not bad, (f"engine {e.name!r} is named outside plan/engines/{e.name}/, {e.section_module} and the two "
                     "registries (move the piece into its package, or ask a shared type):\n" + "\n".join(bad))


def test_the_check_sees_a_module_that_names_an_engine():
    """The test above can fail: a planner module that asks for vLLM's section by its class is caught."""
    vllm = next(e for e in POLICY_ENGINES if e.name == "vllm")
    path = PACKAGE / "plan" / "context.py"
    code = "from slurmrl.recipe.vllm import VllmInference\n\ndef f(r):\n    return isinstance(r, VllmInference)\n"
    found = trespasses(vllm, {path: ast.parse(code)})
    assert found == ["slurmrl/plan/context.py:1: imports slurmrl.recipe.vllm",
                     "slurmrl/plan/context.py:1: names VllmInference", "slurmrl/plan/context.py:4: names VllmInference"]
    assert trespasses(vllm, {PACKAGE / "app" / "x.py": ast.parse("from slurmrl.plan.engines.vllm import flags\n")})
    assert not trespasses(vllm, {ENGINES_DIR / "judge" / "x.py": ast.parse("from slurmrl.plan.engines.vllm import flags\n")})


def test_every_engine_family_is_a_package_behind_the_protocol():
    loose = sorted(p.name for p in ENGINES_DIR.glob("*.py"))
    assert loose == ["__init__.py", "base.py"], "an engine's modules live in its package: plan/engines/<engine>/"
    for family in engines.ENGINES:
        assert family.__file__ is not None and Path(family.__file__) == ENGINES_DIR / family.name / "__init__.py"
        assert isinstance(family, engines.Engine)
    assert [e.name for e in POLICY_ENGINES] == list(engines.BACKENDS)


MEMBERSHIP = re.compile(r"""["']\w+["']\s+(not\s+)?in\s+type\(""")  # "prefill" in type(inf).model_fields


def test_shared_rules_ask_a_type_not_a_field_name():
    engine_dirs = [ENGINES_DIR / name for name in engines.BACKENDS]
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in SOURCES if not any(within(p, d) for d in engine_dirs)
           for n, line in enumerate(p.read_text().splitlines(), 1) if MEMBERSHIP.search(line)]
    assert not bad, "ask the section's type (serving.Disaggregated, router.Routed), not its fields:\n" + "\n".join(bad)
