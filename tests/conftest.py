"""Shared test setup. The real local Slurm cluster fixture lives in tests/slurm_cluster.py.

Marks, set here at collection so that no file can forget them:
- a test that uses ``slurm_cluster`` is marked ``cluster`` (``slurm_debug2`` also ``debug2``: its jobs
  go to the local cluster's second partition); one that uses ``smollm2_dir`` ``slow``
  (building SmolLM2 costs ~25 s): ``-m "not cluster and not vllm and not slow"`` is the fast tier
  (``bash scripts/test.sh --fast``);
- under pytest-xdist the heavy tests run in three groups, each on one worker (tests/xdist_groups.py).
"""

import os
import sys

import pytest
from vllm_python import VllmPython

pytest_plugins = ["slurm_cluster", "xdist_groups"]


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        uses = getattr(item, "fixturenames", ())
        if "slurm_cluster" in uses and not item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.cluster)
        if "slurm_debug2" in uses and not item.get_closest_marker("debug2"):
            item.add_marker(pytest.mark.debug2)
        if "smollm2_dir" in uses and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct as a safetensors folder, built once per session (dequantizing the GGUF
    costs ~25 s on two cores); tests read it and never write into it."""
    from slurmrl.runtime.fixtures import smollm2

    return smollm2.build(tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture(scope="session")
def vllm_python(tmp_path_factory):
    """One process with vLLM imported that runs the parser checks' scripts (tests/vllm_python.py):
    ``vllm_python.run(SCRIPT, *argv, input=...)`` answers like ``subprocess.run``."""
    proc = VllmPython(tmp_path_factory.mktemp("vllm_python") / "stderr.log")
    yield proc
    proc.close()


@pytest.fixture
def doubles(tmp_path, monkeypatch):
    """TEST DOUBLES of Slurm's client commands, first on PATH: each appends its argv (JSON) to
    calls.log and prints nothing (no Slurm runs)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in ("scancel", "squeue", "sacct", "scontrol", "srun", "sbatch"):
        p = bin_dir / tool
        p.write_text(f"#!{sys.executable}\nimport json, sys\n"
                     f"open({str(log)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n")
        p.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log
