"""Shared test setup. The real local Slurm cluster fixture lives in tests/support/slurm_cluster.py.

Marks, set here at collection so that no file can forget them:
- a test that uses ``slurm_cluster`` is marked ``cluster`` (``slurm_debug2`` also ``debug2``: its jobs
  go to the local cluster's second partition); one that uses ``smollm2_dir`` ``slow``
  (building SmolLM2 costs ~25 s): ``-m "not cluster and not vllm and not slow"`` is the fast tier
  (``bash scripts/test.sh --fast``);
- under pytest-xdist the heavy tests run in three groups, each on one worker (tests/support/xdist_groups.py).
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from vllm_python import VllmPython

from slurmrl import secret
from slurmrl.runtime.fixtures import smollm2

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
def smollm2_dir():
    """SmolLM2-135M-Instruct as a safetensors folder, built once per machine (dequantizing the GGUF
    costs ~25 s on two cores, minutes beside other jobs) and kept like pip's cache, in
    ``$XDG_CACHE_HOME/slurmrl-tests`` (~/.cache), under a name that changes with what it is built from
    (the builder's source, the GGUF, transformers' version); the first session or xdist worker to need
    it builds it, under a lock; tests read it and never write into it. Built in a process of its own: a
    worker that built it in-process kept ~1.5 GB of it for the rest of the session, beside the
    cluster's jobs and vLLM servers on a 24 GiB machine."""
    gguf = smollm2.gguf_file()
    key = hashlib.sha256(b"\0".join([Path(smollm2.__file__).read_bytes(), str(gguf.stat().st_size).encode(),
                                      metadata.version("transformers").encode()])).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slurmrl-tests"
    out = cache / f"smollm2-{key}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = cache / f".smollm2-{key}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            r = subprocess.run([sys.executable, "-m", "slurmrl.runtime.fixtures.smollm2", str(tmp)],
                               capture_output=True, text=True, timeout=900)
            assert r.returncode == 0, r.stdout + r.stderr
            tmp.rename(out)  # whole or not at all
    return out


@pytest.fixture(scope="session")
def vllm_python(tmp_path_factory):
    """One process with vLLM imported that runs the parser checks' scripts (tests/support/vllm_python.py):
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


@pytest.fixture
def job_secret(tmp_path, monkeypatch):
    """The job's secret (``slurmrl.secret``) in a file of this test's, as a job step finds it."""
    path = tmp_path / "secret"
    path.write_text("s3cret\n")
    monkeypatch.setenv(secret.ENV, str(path))
    return "s3cret"
