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
import shlex
import sys
from pathlib import Path

import pytest

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
