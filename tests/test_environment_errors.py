"""An RL environment that does not load is named, with its error, where the user looks: the
orchestrator's log (and exit code), and a preflight before any server starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl.app.build import render
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent
BAD = 'orchestrator.environment="pkg_that_is_not_there.envs:Env"'


def test_orchestrator_says_which_environment_does_not_load(tmp_path):
    out = render(ROOT / "recipes" / "rl-debug.toml", [BAD], run_dir=tmp_path / "run")
    r = subprocess.run(
        [sys.executable, "-m", "slurmrl.runtime.orchestrator", "--config",
         str(RunDir(out.run_dir).component_config("orchestrator")),
         "--requests-url", "http://127.0.0.1:9", "--admin-urls", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 1
    assert "cannot load environment 'pkg_that_is_not_there.envs:Env'" in r.stderr
    assert "ModuleNotFoundError" in r.stderr and "PYTHONPATH" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.cluster
def test_preflight_finds_an_environment_that_does_not_load(slurm_cluster, tmp_path):
    r = slurm_cluster.slurmrl("submit", "--preflight", str(ROOT / "recipes" / "rl-debug.toml"),
                              "--set", f'python.executable="{sys.executable}"', "--set", BAD,
                              "--timeout", "180", cwd=tmp_path, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "preflight FAILED: orchestrator.0: cannot load environment 'pkg_that_is_not_there.envs:Env'" in r.stdout
