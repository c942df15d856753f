"""`slurmrl submit RECIPE --join RUN_DIR` refuses what cannot join, in one line (exit 2), writing nothing: a path
that is not a run dir, an SFT run dir, a job whose weights go by broadcast, another model, a finished job. And
the joiner's job script: the recipe's servers alone (slurmrl.plan.join), on its own partition, registering in
RUN_DIR, with vLLM's weight-reload endpoints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_errors import one_line_error

from slurmrl.app.build import build_recipe
from slurmrl.errors import UserError
from slurmrl.plan.join import joiner
from slurmrl.recipe.load import load_recipe
from slurmrl.rundir import jobs
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent
RL_DEBUG = ROOT / "recipes" / "rl-debug.toml"
SFT_DEBUG = ROOT / "recipes" / "sft-debug.toml"


def slurmrl(*args: str, cwd: Path, cluster=None) -> subprocess.CompletedProcess:
    if cluster is not None:
        return cluster.slurmrl(*args, cwd=cwd)
    return subprocess.run([sys.executable, "-m", "slurmrl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def files(where: Path) -> list[str]:
    return sorted(str(p.relative_to(where)) for p in where.rglob("*"))


def rendered(tmp_path: Path, recipe: Path, *sets: str) -> Path:
    args = [x for s in sets for x in ("--set", s)]
    r = slurmrl("render", str(recipe), *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "runs" / load_recipe(recipe, list(sets)).name


def refused(tmp_path: Path, main: str, *sets: str, cluster=None) -> str:
    before = files(tmp_path)
    args = [x for s in sets for x in ("--set", s)]
    r = slurmrl("submit", str(RL_DEBUG), "--join", main, "--set", 'slurm.partition="debug2"', *args, cwd=tmp_path,
                cluster=cluster)
    line = one_line_error(r)
    assert files(tmp_path) == before, "a refused --join wrote something"
    return line


def test_join_refuses_what_cannot_join(tmp_path):
    assert "--join: " in refused(tmp_path, str(tmp_path / "nowhere")) and "no such run dir" in refused(
        tmp_path, str(tmp_path / "nowhere"))
    (tmp_path / "plain").mkdir()
    assert "is not a run dir (no recipe.toml and job.sbatch in it)" in refused(tmp_path, str(tmp_path / "plain"))
    sft = rendered(tmp_path, SFT_DEBUG)
    assert "is a run dir of kind 'sft': servers join an RL job" in refused(tmp_path, str(sft))
    gloo = rendered(tmp_path, RL_DEBUG, "trainer.weight_sync='gloo'", "name='rl-gloo'")
    assert "syncs weights by gloo: a joiner job's servers start without the weight-transfer engine its group needs" in refused(tmp_path, str(gloo))
    main = rendered(tmp_path, RL_DEBUG)
    line = refused(tmp_path, str(main), "model.path='other-model'")
    assert "model.path: is 'other-model', but the job it joins serves 'tiny-model'" in line
    assert "was never submitted" in refused(tmp_path, str(main))


def test_join_refuses_a_finished_job(slurm_cluster, tmp_path):
    main = rendered(tmp_path, RL_DEBUG)
    sub = slurm_cluster.run(["sbatch", "--parsable", "-p", "debug2", "-n1", "-c1", "--hold", "--wrap", "true"])
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    slurm_cluster.run(["scancel", job_id])  # ended before it ran: CANCELLED
    jobs.record(main, job_id, jobs.sha256(RunDir(main).script), False)
    line = refused(tmp_path, str(main), cluster=slurm_cluster)
    assert f"--join: job {job_id} of {main} is CANCELLED, not running" in line


def test_a_joiner_is_the_recipes_servers_alone_registering_in_the_main_run_dir(tmp_path):
    r = load_recipe(RL_DEBUG, ['slurm.partition="debug2"', "slurm.requeue=false", "inference.min_servers=1"])
    out = build_recipe(joiner(r, "rl-debug"), RL_DEBUG, tmp_path / "j", join="/runs/rl-debug")
    assert out.plan.kind == "inference" and out.plan.name == "rl-debug-join"
    assert [c.name for c in out.plan.components] == ["inference"]  # no trainer, orchestrator or router
    script = out.script
    assert "export SLURMRL_JOIN_RUN_DIR=/runs/rl-debug" in script and "export VLLM_SERVER_DEV_MODE=1" in script
    assert "#SBATCH --partition=debug2" in script and "#SBATCH --no-requeue" in script
    assert "--served-model-name tiny-model" in script and "RequireJobSecret" in script


def test_a_joiner_must_be_vllm_replicas():
    with pytest.raises(UserError) as e:
        joiner(load_recipe(ROOT / "recipes" / "inference-sglang.toml"), "x")
    assert "servers that join are vLLM replicas" in str(e.value)
