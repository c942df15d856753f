"""critical = false in bash: supervise (RUN_DIR/slurmrl-functions.sh) logs a non-critical step's
exit as a phase and goes on; the job's result is its main components' alone. A critical step's
exit still fails the job at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

from script_helper import run_helper

from slurmrl.app.build import build
from slurmrl.app.status_report import ComponentStatus, StatusReport
from slurmrl.app.status_text import text
from slurmrl.slurm.watch import Snapshot

ROOT = Path(__file__).resolve().parent.parent


def run(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, Path]:
    return run_helper(tmp_path, body, 'echo "RUNNING 0"')  # the job runs on


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
    rep = StatusReport(Snapshot("7", "RUNNING"), components=[
        ComponentStatus("collector", 0, main=False, critical=False, instances=1, ready=[0]),
        ComponentStatus("trainer", 0, main=True, critical=True, instances=1, ready=[])])
    rows = [line.split("  ")[1] for line in text(rep).splitlines() if line.startswith("  collector")
            or line.startswith("  trainer")]
    assert rows == ["collector (critical = false)", "trainer"]
