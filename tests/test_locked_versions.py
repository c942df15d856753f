"""What scripts/install.sh installed is what scripts/constraints/ locks: a fresh clone tests against the
versions the tests last passed with, not whatever was released since (tomlkit 0.15.3 once changed an
error message under the tests). An environment the install has not made yet is skipped, saying so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCKS = sorted((ROOT / "scripts" / "constraints").glob("*.txt"))


def test_every_pip_install_takes_its_environments_lock():
    """install.sh runs pip in one place, pip_in, which passes the environment's own lock; every other
    line that installs names an environment that has one."""
    text = (ROOT / "scripts" / "install.sh").read_text()
    pips = [line for line in text.splitlines() if re.search(r"\bpip install\b", line) and not line.lstrip().startswith("#")]
    assert len(pips) == 1 and '-c "scripts/constraints/${venv#.}.txt"' in pips[0], pips
    venvs = re.findall(r"^\s*pip_in (\S+) ", text, re.M)
    assert venvs
    for venv in venvs:
        assert venv.startswith(".venv") and (ROOT / "scripts" / "constraints" / f"{venv[1:]}.txt").is_file(), venv


@pytest.mark.parametrize("lock", LOCKS, ids=[p.stem for p in LOCKS])
def test_installed_versions_match_the_lock(lock):
    venv = ROOT / f".{lock.stem}"
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"{venv.name} is not installed here (scripts/install.sh makes it)")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock.py"), "--check", str(venv), str(lock)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{venv.name} differs from {lock.name} (rerun scripts/install.sh):\n{r.stdout}{r.stderr}"


def test_a_lock_pins_every_line_exactly():
    for lock in LOCKS:
        for line in lock.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, sep, version = line.partition("==")
                assert sep and name and version and " " not in line, f"{lock.name}: {line!r}"
