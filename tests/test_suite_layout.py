"""The test suite's own layout (tests/README.md): test files in tests/, everything they share in
tests/support/ (helpers, test doubles, fixtures), and no test file imported by another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"


def imported_modules(path: Path) -> set[str]:
    """Every dotted part of every module the file imports, inside functions too."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {part for a in node.names for part in a.name.split(".")}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= set(node.module.split("."))  # ``tests.test_x`` too
    return out


def test_no_test_file_imports_another():
    bad = sorted(f"{p.name} imports {m}" for p in [*TESTS.glob("*.py"), *SUPPORT.rglob("*.py")]
                 for m in imported_modules(p) if m.startswith("test_"))
    assert not bad, "move what they share into tests/support/: " + "; ".join(bad)


def test_tests_holds_test_files_and_support_holds_the_rest():
    stray = sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_")
                   and p.name not in ("conftest.py", "golden.py"))
    assert not stray, f"helpers belong in tests/support/: {stray}"
    assert sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__") == ["support"]
    named_as_tests = sorted(p.name for p in SUPPORT.rglob("test_*.py"))
    assert not named_as_tests, f"pytest would collect these as tests: {named_as_tests}"
