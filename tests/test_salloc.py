"""The rendered script runs unchanged inside the allocation `slurmrl plan --salloc` prints:
`salloc <group 0 options> : <group 1 options> bash RUN_DIR/job.sbatch` (salloc runs the command
inside the allocation, non-interactively), here for a preflight-rendered rl-debug; then every
probe's report is checked against plan.json, as `submit --preflight` does.

salloc runs the script where it is called, on this machine, not on a node. Its readiness checks
reach the nodes by name; a real login node resolves node names through DNS, the local cluster
only through its own hosts file, so the command runs in a private mount namespace where that
file is bind-mounted over /etc/hosts (nothing on the machine changes).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from status_jobs import FAKE_PYTHON

from slurmrl.app import preflight
from slurmrl.app.build import render
from slurmrl.slurm.watch import Watch

ROOT = Path(__file__).resolve().parent.parent
PY_OVERRIDE = f'python.executable="{sys.executable}"'


@pytest.mark.cluster
def test_the_rendered_script_runs_inside_salloc(slurm_cluster, tmp_path, monkeypatch):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    out = render(recipe, [PY_OVERRIDE], run_dir=tmp_path / "rl-debug-preflight", preflight=True)
    r = slurm_cluster.run([sys.executable, "-m", "slurmrl", "plan", str(recipe), "--salloc", "--set", PY_OVERRIDE,
                           "--run-dir", str(out.run_dir)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    inner = r.stdout.strip()  # salloc <group 0> : <group 1> bash RUN_DIR/job.sbatch
    assert inner.startswith("salloc ") and " : " in inner  # a het allocation: one part per group
    assert inner.endswith(f" bash {shlex.quote(str(out.run_dir / 'job.sbatch'))}")

    hosts_file = slurm_cluster.state_dir / "etc" / "hosts"
    cmd = ["unshare", "--mount", "sh", "-c", f'mount --bind "$0" /etc/hosts && exec {inner}', str(hosts_file)]
    r = slurm_cluster.run(cmd, cwd=tmp_path, env={"SLURMRL_PROBE_TIMEOUT": "30"}, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "slurmrl: all done" in r.stdout
    assert "Granted job allocation" in r.stderr

    reports = [json.loads(f.read_text()) for f in (out.run_dir / "preflight").glob("*.json")]
    assert len(reports) == sum(len(c.instances) for c in out.plan.components)
    job_id = reports[0]["env"]["SLURM_JOB_ID"]
    assert {rep["env"]["SLURM_JOB_ID"] for rep in reports} == {job_id}
    assert not (out.run_dir / "logs" / "attempt-0" / "FAILED").exists()
    # the script recorded its allocation: `status RUN_DIR` works for a run that was never submitted
    assert (out.run_dir / "allocations").read_text().split()[-1] == job_id
    st = slurm_cluster.run([sys.executable, "-m", "slurmrl", "status", str(out.run_dir), "--json"], cwd=tmp_path)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["job_id"] == job_id

    for key, value in slurm_cluster.cluster_vars.items():
        monkeypatch.setenv(key, value)
    # where each group's nodes are: Slurm's allocation as the steps saw it, and sacct's record of it
    from_steps = preflight.GroupHosts()
    from_steps.add_reports(preflight.read_reports(out.run_dir))
    hosts = from_steps.hosts
    assert sorted(hosts) == [0, 1]
    assert preflight.GroupHosts().complete(Watch(job_id), len(out.plan.groups), wait_s=60) == hosts
    rows = preflight.check(out.run_dir, out.plan, job_id, hosts)
    assert [r.problems for r in rows] == [[] for _ in rows], preflight.report_table(rows)


@pytest.mark.cluster
def test_slurmrl_cancel_inside_salloc_reads_as_a_cancel(slurm_cluster, tmp_path):
    """Inside salloc no TERM reaches the script when the job is cancelled: its steps end (code 143)
    and the script saw "router exited with code 143", a failure. Now it asks the controller, which
    is ending the job: STOPPED, and `status` says cancelled."""

    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    recipe = ROOT / "recipes" / "rl-debug.toml"
    sets = [f'python.executable="{fake}"', "slurm.grace_seconds=5"]
    out = render(recipe, sets, run_dir=tmp_path / "rl-debug")
    r = slurm_cluster.run([sys.executable, "-m", "slurmrl", "plan", str(recipe), "--salloc", "--run-dir",
                           str(out.run_dir), *[a for s in sets for a in ("--set", s)]], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    hosts_file = slurm_cluster.state_dir / "etc" / "hosts"
    cmd = ["unshare", "--mount", "sh", "-c", f'mount --bind "$0" /etc/hosts && exec {r.stdout.strip()}',
           str(hosts_file)]
    env = {**os.environ, **slurm_cluster.cluster_vars, "SLURMRL_PROBE_TIMEOUT": "30", "SLURMRL_TEST_HOLD": "trainer"}
    log = tmp_path / "salloc.log"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        phases = out.run_dir / "logs" / "attempt-0" / "phases"
        deadline = time.monotonic() + 120
        while not (phases.exists() and "all components ready" in phases.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        c = slurm_cluster.slurmrl("cancel", str(out.run_dir), cwd=tmp_path)
        assert c.returncode == 0, c.stdout + c.stderr
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    attempt = out.run_dir / "logs" / "attempt-0"
    assert not (attempt / "FAILED").exists(), text
    assert "as Slurm ended the job" in (attempt / "STOPPED").read_text(), text
    assert code != 0 and "exited with code 143" not in text, text
    deadline = time.monotonic() + 60  # sacct lags the controller: wait for the job's end there, with a deadline
    while True:
        st = slurm_cluster.slurmrl("status", str(out.run_dir), cwd=tmp_path)
        if "STOPPED: cancelled" in st.stdout or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert "STOPPED: cancelled" in st.stdout and "FAILED:" not in st.stdout, st.stdout + st.stderr
    table = st.stdout.split("\n  component ", 1)[1].split("\n\n", 1)[0]  # the components' rows
    assert "FAILED" not in table and "stopped" in table, table  # a cancel is a planned stop: no step FAILED
