"""Sweeps, the lock and `submit --again` on the local Slurm (issue 17 items 1 and 2), sharing jobs:

- sweep A: sft-debug over trainer.lr, --max-running 1: one job array (``%1``). While point 0 trains,
  point 1 waits (JobArrayTaskLimit); `status SWEEP_DIR` shows a row per point with its latest loss;
  the job appended its interpreter's versions to point 0's lock.toml; `cancel SWEEP_DIR` ends both.
- sweep B: over slurm.cpus_per_node (different #SBATCH lines: no array), --max-running 1 and a
  dependency of its own: one job per point, the second waiting (afterany) for the first.
- `submit --again` of A's point 0 with a hand edit: a new run dir, the edit carried over, linked
  both ways in status.
The jobs are the tiny model on the CPU and are cancelled once seen; about a minute and a half."""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from polling import wait_for

from slurmrl.rundir import lockfile as lock
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

ROOT = Path(__file__).resolve().parent.parent
SFT = ROOT / "recipes" / "sft-debug.toml"

pytestmark = pytest.mark.cluster


def ok(r):
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_sweeps_lock_and_again_on_slurm(slurm_cluster, tmp_path):
    started = time.monotonic()

    def mark(what):  # where the time goes (pytest -s shows it); the queue wait depends on other jobs
        print(f"+{time.monotonic() - started:5.1f}s {what}", flush=True)

    tiny = build_tiny(tmp_path / "tiny")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}:", "completion": f" {i}\n"}) + "\n" for i in range(32)))
    common = ["--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
              "--set", f'trainer.dataset="{data}"', "--set", "trainer.max_steps=100000",
              "--set", "trainer.checkpoint_every=100000", "--set", "slurm.grace_seconds=3"]

    def slurmrl(*args):
        return slurm_cluster.slurmrl(*args, cwd=tmp_path, timeout=180)

    def status_json(target):
        return json.loads(ok(slurmrl("status", str(target), "--json")))

    a, b = tmp_path / "a", tmp_path / "b"
    out = ok(slurmrl("sweep", str(SFT), "--grid", "trainer.lr=1e-3,3e-3", "--max-running", "1",
                     "--sweep-dir", str(a), *common))
    array = json.loads((RunDir(a).sweep_index).read_text())["submissions"][-1]
    assert array["mode"] == "array" and f"as job array {array['array_job']}, at most 1 running" in out
    assert "#SBATCH --array=0-1%1" in (RunDir(a).sweep_script).read_text()
    a0 = a / "sft-debug-p0"
    assert array["job_ids"] == [f"{array['array_job']}_0", f"{array['array_job']}_1"]

    # B: the points ask for different CPUs, so one job per point; its own dependency (on A's second
    # point, which never runs) keeps it from running at all
    out = ok(slurmrl("sweep", str(SFT), "--grid", "slurm.cpus_per_node=4,8", "--max-running", "1",
                     "--set", f"slurm.dependency=afterok:{array['job_ids'][1]}", "--sweep-dir", str(b), *common))
    jobs_b = json.loads((RunDir(b).sweep_index).read_text())["submissions"][-1]
    assert jobs_b["mode"] == "jobs" and "different resources" in jobs_b["why_not_array"], jobs_b
    deps = {j: slurm_cluster.run(["squeue", "-h", "-j", j, "-o", "%E"]).stdout.strip() for j in jobs_b["job_ids"]}
    assert deps[jobs_b["job_ids"][0]].startswith(f"afterok:{array['job_ids'][1]}"), deps
    assert f"afterany:{jobs_b['job_ids'][0]}" in deps[jobs_b["job_ids"][1]], deps

    mark("both sweeps submitted")
    # A's point 0 trains; point 1 waits for it (the array's %1)
    metrics = a0 / "metrics" / "trainer.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().strip(), "point 0's first training step", timeout=300)
    mark(f"point 0 stepped (it started at {slurm_cluster.run(['squeue', '-h', '-j', array['job_ids'][0], '-o', '%S']).stdout.strip()})")
    reason = slurm_cluster.run(["squeue", "-h", "-j", array["job_ids"][1], "-o", "%T %r"]).stdout.split()
    assert reason == ["PENDING", "JobArrayTaskLimit"], reason
    rep = status_json(a)
    p0, p1 = rep["points"]
    assert (p0["state"], p0["attempt"], p0["job_id"]) == ("RUNNING", 0, array["job_ids"][0]), p0
    assert p0["metrics"]["step"] >= 1 and isinstance(p0["metrics"]["loss"], float)
    assert (p1["state"], p1["values"]) == ("PENDING", {"trainer.lr": 3e-3}), p1
    text = ok(slurmrl("status", str(a)))
    assert "job array" in text and "sft-debug-p1  0.003" in text and "loss" in text, text
    # the job wrote its interpreter's versions into the lock
    runtime = lock.meta(a0)["runtime"]
    assert runtime[0]["component"] == "trainer" and runtime[0]["torch"] == version("torch"), runtime
    assert runtime[0]["executable"] == sys.executable and runtime[0]["attempt"] == 0

    mark("status checked")
    # cancel both sweeps: every point ends
    ok(slurmrl("cancel", str(a)))
    ok(slurmrl("cancel", str(b)))
    assert {p["state"] for p in status_json(a)["points"]} == {"CANCELLED"}
    assert {p["state"] for p in status_json(b)["points"]} == {"CANCELLED"}

    mark("both sweeps cancelled")
    # the same run again, with a hand edit, as a new run dir linked to the first
    script = RunDir(a0).script
    edited = script.read_text().replace("set -euo pipefail\n", "set -euo pipefail\necho 'edited by hand'\n", 1)
    script.write_text(edited)
    out = ok(slurmrl("submit", "--again", str(a0)))
    new = a / "sft-debug-p0-again-1"
    assert "submitted job" in out and str(new) in out and "edited by hand" in out, out
    assert (RunDir(new).script).read_text() == edited.replace(str(a0), str(new))
    assert lock.meta(new)["again_of"] == str(a0) and lock.meta(new)["edited"] is True
    assert f"again of: {a0}" in ok(slurmrl("status", str(new)))
    old_status = ok(slurmrl("status", str(a0)))
    assert f"run again as: {new}" in old_status and f"a point of sweep: {a}" in old_status
    ok(slurmrl("cancel", str(new)))
    mark("submit --again checked and cancelled")
