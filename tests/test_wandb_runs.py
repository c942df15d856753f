"""[wandb]: the trainer's and the orchestrator's runs land in one group, with the user's project, name
and tags (real wandb, offline mode: its run files are read back); the mode comes from the recipe,
else the job's WANDB_MODE, else offline; the metrics files stay the record either way."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl import cli
from slurmrl.runtime import tracking
from slurmrl.settings.wandb import WandbSettings

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("wandb")

# What each program does with its settings (slurmrl.runtime.trainer.loop, slurmrl.runtime.orchestrator.loop):
# its Metrics with the component file's [wandb]; the orchestrator's eval rows beside its own.
PROGRAM = """
import sys
from pathlib import Path
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.metrics import Metrics
from slurmrl.settings import orchestrator, trainer

role, run_dir = sys.argv[1], Path(sys.argv[2])
s = (trainer if role == "trainer" else orchestrator).load(RunDir(run_dir).component_config(role))
m = Metrics(run_dir, role, s.model_dump(mode="json"), print, wandb_prefix=role + "/" if role == "trainer" else "",
            tracking_settings=s.wandb)
assert m.wandb is not None, "wandb did not start"
if role == "orchestrator":
    ev = m.beside(RunDir(run_dir).eval_metrics, "eval/")
    ev.log({"step": 0, "reward_mean": 0.25, "pass@1": 0.0})
for step in (1, 2):
    m.log({"step": step, "reward_mean": 0.5 * step, "loss": 1.0 / step})
if role == "orchestrator":
    ev.log({"step": 2, "reward_mean": 0.75, "pass@1": 0.5})
Metrics.close_all(0)
"""


def render(run_dir: Path, overrides: list[str]) -> None:
    argv = ["render", str(ROOT / "recipes" / "rl-debug.toml"), "--run-dir", str(run_dir)]
    for o in overrides:
        argv += ["--set", o]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert cli.main(argv) == 0, err.getvalue()


def run_programs(run_dir: Path, extra_env: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PYTHONPATH=str(ROOT), WANDB_SILENT="true", **extra_env)
    for role in ("trainer", "orchestrator"):
        p = subprocess.run([sys.executable, "-c", PROGRAM, role, str(run_dir)], env=env, capture_output=True,
                           text=True, timeout=240, cwd=run_dir)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def test_trainer_and_orchestrator_share_one_group_with_the_users_names(tmp_path):
    from wandb_records import runs

    run_dir = tmp_path / "exp-42"
    render(run_dir, ["wandb.project='rl-reverse'", "wandb.name='lr-2e-3'", "wandb.tags=['smoke', 'tiny']",
                     "wandb.mode='offline'", "eval.every=2"])
    run_programs(run_dir, {"WANDB_MODE": "online"})  # the recipe's mode wins over the job's environment
    found = runs(run_dir)
    assert set(found) == {"exp-42-trainer", "exp-42-orchestrator"}, found
    for role in ("trainer", "orchestrator"):
        r = found[f"exp-42-{role}"]
        assert (r["project"], r["group"], r["name"], r["tags"], r["job_type"]) == (
            "rl-reverse", "exp-42", f"lr-2e-3-{role}", ["smoke", "tiny"], role), r
    assert {"trainer/loss", "trainer/reward_mean"} <= found["exp-42-trainer"]["history"]
    assert {"reward_mean", "eval/reward_mean", "eval/pass@1", "eval/step"} <= found["exp-42-orchestrator"]["history"]
    # the metrics files are the record, whatever W&B does
    rows = [json.loads(x) for x in (run_dir / "metrics" / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2]
    assert [json.loads(x)["step"] for x in (run_dir / "metrics" / "trainer.jsonl").read_text().splitlines()] == [1, 2]


def test_disabled_writes_no_wandb_files_and_keeps_the_metrics(tmp_path):
    run_dir = tmp_path / "quiet"
    render(run_dir, ["wandb.mode='disabled'"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    code = PROGRAM.replace('assert m.wandb is not None, "wandb did not start"', "assert m.wandb is None")
    p = subprocess.run([sys.executable, "-c", code, "orchestrator", str(run_dir)], capture_output=True, text=True,
                       env={**env, "PYTHONPATH": str(ROOT)}, timeout=120, cwd=run_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not (run_dir / "wandb").exists() and (run_dir / "metrics" / "orchestrator.jsonl").exists()


def test_mode_comes_from_the_recipe_else_the_jobs_environment_else_offline(tmp_path):
    assert tracking.mode(WandbSettings(mode="disabled"), {"WANDB_MODE": "online"}) == "disabled"
    assert tracking.mode(WandbSettings(), {"WANDB_MODE": "online"}) == "online"
    assert tracking.mode(WandbSettings(), {}) == "offline" and tracking.mode(None, {}) == "offline"
    args = tracking.init_args(WandbSettings(entity="team-a"), tmp_path / "run-7", "trainer", {"lr": 1})
    assert {k: args[k] for k in ("project", "entity", "group", "name", "job_type", "id", "resume")} == {
        "project": "slurmrl", "entity": "team-a", "group": "run-7", "name": "run-7-trainer", "job_type": "trainer",
        "id": "run-7-trainer", "resume": "allow"}
    assert "api_key" not in args and "key" not in args  # W&B reads WANDB_API_KEY from the environment itself
    # a run dir's name W&B would refuse (--run-dir takes any folder) still names the group, made safe
    odd = tracking.init_args(None, tmp_path / "a:b#c\x02", "orchestrator", {})
    assert odd["group"] == "a_b_c_" and odd["name"] == "a_b_c_-orchestrator"
