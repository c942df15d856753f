"""Hand edits to a rendered job.sbatch work on the real local Slurm cluster.

inference-debug renders two servers (one per node, one GPU each) and vllm-router. The user
doubles the servers per node by editing the srun line (tasks, CPUs and GPUs per node) and the
group's ``#SBATCH --gpus-per-node``: ports and GPU slices follow ``SLURM_LOCALID`` in the task
function, the readiness wait counts the tasks the step really runs, and the router gets all four
URLs. The vLLM command line is replaced by a test
double (tests/support/ok_server.py) in the script itself: this test is about the script, not the engine.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from script_edits import serve_with_ok_server

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parent.parent


def test_more_servers_per_node_by_editing_the_srun_line(slurm_cluster, tmp_path):
    r = slurm_cluster.slurmrl(
        "render", str(ROOT / "recipes" / "inference-debug.toml"),
        "--set", f'python.executable="{sys.executable}"', "--set", "slurm.grace_seconds=3", cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs" / "inference-debug"
    script = run_dir / "job.sbatch"
    text = script.read_text()
    srun = "--ntasks=2 --ntasks-per-node=1 --cpus-per-task=6 --exact --gpus-per-node=1"
    assert text.count(srun) == 1 and text.count("#SBATCH --gpus-per-node=1\n") == 1
    text = text.replace(srun, "--ntasks=4 --ntasks-per-node=2 --cpus-per-task=3 --exact --gpus-per-node=2")
    text = text.replace("#SBATCH --gpus-per-node=1\n", "#SBATCH --gpus-per-node=2\n")
    script.write_text(serve_with_ok_server(text))
    r = slurm_cluster.slurmrl("submit", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ready = RunDir(run_dir).ready_dir(0)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (ready / "router.0").exists():
            assert not RunDir(run_dir).failed_file(0).exists(), RunDir(run_dir).failed_file(0).read_text()
            time.sleep(1)
        assert (ready / "router.0").exists(), sorted(p.name for p in ready.glob("*"))
        tasks = {t: read_ready(f) for t, f in RunDir(run_dir).ready_tasks(0, "inference").items()}
        assert sorted(tasks) == [0, 1, 2, 3]
        assert {n for _, n, _ in tasks.values()} == {4}
        urls = [u for u, _, _ in tasks.values()]
        hosts = [u.split(":")[1] for u in urls]  # two nodes (whichever Slurm gave), two servers each
        assert len(set(urls)) == 4 and len(set(hosts)) == 2 and all(hosts.count(h) == 2 for h in hosts), urls
        # each task kept its own GPU: positions 0 and 1 of the two the step got on its node
        for task in range(4):
            log = (RunDir(run_dir).log_dir(0) / f"inference.{task}.log").read_text()
            assert f"(positions {task % 2}:1)" in log, log
        # the router was started with every URL the servers reported
        router_log = (RunDir(run_dir).log_dir(0) / "router.0.log").read_text()
        argv = next(line for line in router_log.splitlines() if "exec:" in line)
        assert all(u in argv for u in urls), argv
        batch = RunDir(run_dir).batch_log(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
        assert "inference ready (4 task(s)" in batch.read_text()
    finally:
        c = slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=120)
    assert c.returncode == 0, c.stdout + c.stderr
