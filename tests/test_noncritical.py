"""critical = false in bash: supervise (RUN_DIR/slurmrl-functions.sh) logs a non-critical step's
exit as a phase and goes on; the job's result is its main components' alone. A critical step's
exit still fails the job at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

from slurmrl.app import status
from slurmrl.app.build import build

ROOT = Path(__file__).resolve().parent.parent
HELPER = (ROOT / "sbatch" / "slurmrl-functions.sh").read_text()


def run(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, Path]:
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "logs" / "attempt-0"
    bin_dir.mkdir(exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "squeue").write_text('#!/bin/bash\necho "RUNNING 0"\n')  # the job runs on
    (bin_dir / "squeue").chmod(0o755)
    (tmp_path / "f.sh").write_text(HELPER)
    script = (f'set -euo pipefail\nPATH={str(bin_dir)!r}:"$PATH"\nRUN_DIR={str(tmp_path)!r}\n'
              f'LOG_DIR={str(log_dir)!r}\nATTEMPT=0\nSLURM_JOB_ID=42\nWARN_SIGNAL=USR1\n'
              f'GRACE_SECONDS=1\nsource "$RUN_DIR/f.sh" 1\nstop_components() {{ :; }}\n{body}\n')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60), log_dir


def test_a_noncritical_step_that_fails_leaves_the_job_running_to_its_end(tmp_path):
    marker = tmp_path / "trainer-done"
    body = (f"NONCRITICAL=(collector)\nlaunch collector bash -c 'exit 3'\n"
            f"launch trainer bash -c 'sleep 1; touch {str(marker)!r}'\nsupervise trainer")
    r, log_dir = run(tmp_path, body)
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.exists() and "slurmrl: trainer finished" in r.stdout
    assert not (log_dir / "FAILED").exists()
    assert "collector exited with code 3 (critical = false: the job goes on)" in (log_dir / "phases").read_text()


def test_a_critical_step_that_fails_still_fails_the_job(tmp_path):
    body = ("NONCRITICAL=(collector)\nlaunch router bash -c 'exit 3'\n"
            "launch trainer bash -c 'sleep 30'\nsupervise trainer")
    r, log_dir = run(tmp_path, body)
    assert r.returncode == 1
    assert (log_dir / "FAILED").read_text().strip() == "router exited with code 3"


def test_critical_false_is_planned_and_rendered_visibly(tmp_path):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    out = build(recipe, ["collector.interval=5"], run_dir=tmp_path / "a")
    collector = out.plan.component("collector")
    assert not collector.critical and all(c.critical for c in out.plan.components if c.name != "collector")
    assert "\nNONCRITICAL=(collector)  # critical = false" in out.script
    assert "# collector: critical = false: when it exits" in out.script
    judged = build(ROOT / "recipes" / "rl-judge.toml", ["judge.critical=false"], run_dir=tmp_path / "b")
    assert not judged.plan.component("judge").critical
    plain = build(recipe, [], run_dir=tmp_path / "c").script
    assert "NONCRITICAL=(" not in plain


def test_status_marks_a_noncritical_component():
    rep = {"job_id": "7", "state": "RUNNING", "run_dir": None, "parts": [], "steps": [], "failed": None, "components": [
        {"name": "collector", "group": 0, "main": False, "critical": False, "instances": 1, "step": None, "ready": [0]},
        {"name": "trainer", "group": 0, "main": True, "critical": True, "instances": 1, "step": None, "ready": []}]}
    rows = [line.split("  ")[1] for line in status.text(rep).splitlines() if line.startswith("  collector")
            or line.startswith("  trainer")]
    assert rows == ["collector (critical = false)", "trainer"]
