"""slurmrl in the job's image (issue 40 item 2): a job with a container first runs the run dir's
slurmrl-check.py with the job's Python in that container, and a Python without slurmrl, or with
another slurmrl than the one that rendered the script, ends the job in one line before any component
starts, in `submit` and in `submit --preflight` alike.

Real interpreters: a bare venv (no slurmrl) and a venv whose installed slurmrl distribution is another
version (its dist-info and package folder laid out as pip lays them out; no pip run, to stay fast).
On the local cluster the Pyxis test double (tests/support/pyxis_double) makes real sbatch/srun take the
container flags; it runs no image, so the step's Python is the recipe's python.executable.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmrl.app.build import render
from slurmrl.contract import slurmrl_check
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "/images/no-slurmrl.sqsh"
NO_PYTHONPATH = 'env={PYTHONPATH=""}'  # the job's steps must not find this checkout through the tests' PYTHONPATH


def bare_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    return where / "bin" / "python"


def venv_with_slurmrl(where: Path, version: str, commit: str | None = None) -> Path:
    """A venv with an installed ``slurmrl`` distribution at ``version`` (from ``pip install git+...@commit``
    when ``commit`` is given: PEP 610's direct_url.json records it)."""
    py = bare_venv(where)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "slurmrl").mkdir()
    (site / "slurmrl" / "__init__.py").write_text("")
    info = site / f"slurmrl-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: slurmrl\nVersion: {version}\n")
    if commit:
        (info / "direct_url.json").write_text(json.dumps(
            {"url": "https://example.org/slurmrl.git", "vcs_info": {"vcs": "git", "commit_id": commit}}))
    return py


def check(py: Path, lock: Path, tmp: Path) -> subprocess.CompletedProcess:
    script = tmp / RunDir.SLURMRL_CHECK  # as the render writes it into a run dir
    script.write_text(Path(slurmrl_check.__file__).read_text())
    return subprocess.run([str(py), str(script), str(lock), IMAGE], capture_output=True, text=True, timeout=60,
                          cwd=tmp, env={"PATH": "/usr/bin:/bin"})


def lock_file(tmp: Path, version: str, commit: str | None = None) -> Path:
    path = tmp / "lock.toml"
    path.write_text(f'name = "x"\n\n[lock.slurmrl]\nversion = "{version}"\n'
                    + (f'commit = "{commit}"\n' if commit else ""))
    return path


def test_a_python_without_slurmrl_is_named_in_one_line(tmp_path):
    r = check(bare_venv(tmp_path / "bare"), lock_file(tmp_path, "0.1.0"), tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"slurmrl is not installed in the job's Python ({tmp_path}/bare/bin/python, "
                               f"container image {IMAGE}): put it in the image (docker/Dockerfile")


def test_another_version_is_named_with_both_versions(tmp_path):
    r = check(venv_with_slurmrl(tmp_path / "old", "0.0.9"), lock_file(tmp_path, "0.1.0"), tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "has slurmrl 0.0.9 at " in r.stderr and "was rendered by slurmrl 0.1.0:" in r.stderr


def test_where_both_know_a_commit_the_commits_decide(tmp_path):
    ours, theirs = "a" * 40, "b" * 40
    py = venv_with_slurmrl(tmp_path / "git", "0.1.0", commit=theirs)
    r = check(py, lock_file(tmp_path, "0.1.0", ours), tmp_path)
    assert r.returncode == 1
    assert f"slurmrl 0.1.0 (commit {theirs[:12]})" in r.stderr and f"slurmrl 0.1.0 (commit {ours[:12]})" in r.stderr
    r = check(py, lock_file(tmp_path, "0.1.0", theirs), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"slurmrl 0.1.0 (commit {theirs[:12]}) in the job's Python ({py}, container image {IMAGE}): "
                        "the slurmrl that rendered the job\n")
    r = check(py, lock_file(tmp_path, "0.1.0"), tmp_path)  # a renderer outside a checkout: the version decides
    assert r.returncode == 0, r.stderr


def test_the_renderers_own_python_passes_against_the_lock_it_wrote(tmp_path):
    out = render(ROOT / "recipes/rl-debug.toml", ["container.image=\"/images/x.sqsh\""], run_dir=tmp_path / "run")
    run_dir = out.run_dir
    assert (run_dir / RunDir.SLURMRL_CHECK).read_text() == Path(slurmrl_check.__file__).read_text()
    r = subprocess.run([sys.executable, str(run_dir / RunDir.SLURMRL_CHECK), str(run_dir / RunDir.LOCK)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "the slurmrl that rendered the job" in r.stdout
    # without a container there is no image to check: no step, no file
    plain = render(ROOT / "recipes/rl-debug.toml", [], run_dir=tmp_path / "plain").run_dir
    assert not (plain / RunDir.SLURMRL_CHECK).exists()
    assert "slurmrl-check" not in (plain / "job.sbatch").read_text()


def submit(cluster, tmp: Path, python: Path, *extra: str) -> subprocess.CompletedProcess:
    return cluster.slurmrl("submit", *extra, str(ROOT / "recipes/rl-debug.toml"), "--set", f'python.executable="{python}"',
                           "--set", f'container.image="{IMAGE}"', "--set", NO_PYTHONPATH, cwd=tmp,
                           env={"SLURMRL_PROBE_TIMEOUT": "30"}, timeout=300)


@pytest.mark.cluster
def test_a_job_whose_image_lacks_slurmrl_ends_in_one_line_before_any_component(slurm_cluster, tmp_path):
    py = bare_venv(tmp_path / "bare")
    r = submit(slurm_cluster, tmp_path, py)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-debug"
    job_id = str(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
    failed = RunDir(run_dir).failed_file(0)
    try:
        deadline = time.monotonic() + 240
        while not failed.exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert failed.exists(), slurm_cluster.run(["squeue", "-j", job_id]).stdout
        assert failed.read_text() == (f"slurmrl is not installed in the job's Python ({py}, container image {IMAGE}): "
                                      "put it in the image (docker/Dockerfile; docs/slurm.md, 'slurmrl in the job's "
                                      "image')\n")
        status = slurm_cluster.slurmrl("status", str(run_dir), "--watch", cwd=tmp_path, timeout=120)
        assert "slurmrl is not installed in the job's Python" in status.stdout + status.stderr
        # no component ever started: the check was the job's first container step
        logs = sorted(p.name for p in (run_dir / "logs" / "attempt-0").glob("*.log"))
        assert "slurmrl-check.log" in logs and not [n for n in logs if n.split(".")[0] in
                                                     ("inference", "trainer", "orchestrator")], logs
    finally:
        slurm_cluster.run(["scancel", job_id])


@pytest.mark.cluster
def test_preflight_names_an_image_with_another_slurmrl(slurm_cluster, tmp_path):
    py = venv_with_slurmrl(tmp_path / "old", "0.0.9")
    r = submit(slurm_cluster, tmp_path, py, "--preflight", "--timeout", "180")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("preflight FAILED")]
    assert len(lines) == 1 and "has slurmrl 0.0.9" in lines[0], r.stdout + r.stderr  # not one per probe
    assert f"the job's Python ({py}, container image {IMAGE}) has slurmrl 0.0.9 at " in lines[0]
    assert "rendered by slurmrl 0.1.0" in lines[0]
    run_dir = tmp_path / "runs" / "rl-debug-preflight"
    assert not list((run_dir / "preflight").glob("*.json"))  # no probe ran


@pytest.mark.slow  # ~20 s: pip builds slurmrl from this checkout's git history
def test_the_dockerfiles_install_records_the_commit_the_check_compares(tmp_path):
    """docker/Dockerfile's pip line, run here (no Docker: into a folder, without dependencies): pip
    records the commit it installed (PEP 610), and the check reads it from there, without git."""
    line = re.search(r'pip install --no-cache-dir "([^"]+)"', (ROOT / "docker" / "Dockerfile").read_text()).group(1)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    req = line.replace("file://localhost/src@", f"file://localhost{ROOT}@").replace("${SLURMRL_COMMIT}", head)
    target = tmp_path / "image-site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), req], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    py = bare_venv(tmp_path / "image")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)}
    script = tmp_path / RunDir.SLURMRL_CHECK
    script.write_text(Path(slurmrl_check.__file__).read_text())
    for commit, rc in ((head, 0), ("f" * 40, 1)):
        lock = lock_file(tmp_path, "0.1.0", commit)
        r = subprocess.run([str(py), str(script), str(lock)], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == rc, r.stdout + r.stderr
        assert f"slurmrl 0.1.0 (commit {head[:12]})" in r.stdout + r.stderr
