"""`slurmrl sweep` without Slurm (issue 17 item 2): one complete run dir per grid point, the index,
the [sweep] table, bad grids (one line naming the field, exit 2, nothing written), when the points
can be one job array, and sacct/squeue rows of array tasks. On the local Slurm: test_sweep_cluster.py."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from slurmrl.app import sweep
from slurmrl.app.build import build
from slurmrl.rundir import lockfile as lock
from slurmrl.rundir.links import read_links
from slurmrl.rundir.paths import RunDir
from slurmrl.slurm.watch import HetInfoWatcher, array_rows

ROOT = Path(__file__).resolve().parent.parent
SFT = ROOT / "recipes" / "sft-debug.toml"


def slurmrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurmrl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_one_complete_run_dir_per_point_with_an_index(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT.read_text() + '\n[sweep]\ngrid = { "trainer.lr" = [1e-3, 3e-3], "trainer.seed" = [0] }\n'
                      "max_running = 3\n")
    # --grid replaces the table's key and adds another; --set applies to every point
    d = sweep.render_sweep(recipe, ["trainer.seed=1,2", "slurm.time=00:05:00"], ["trainer.max_steps=7"])
    assert d == tmp_path / "runs" / "sft-debug-sweep"
    index = sweep.read_index(d)
    assert index["grid"] == {"trainer.lr": [1e-3, 3e-3], "trainer.seed": [1, 2], "slurm.time": ["00:05:00"]}
    assert index["max_running"] == 3 and index["submissions"] == []
    assert [p["name"] for p in index["points"]] == [f"sft-debug-p{i}" for i in range(4)]
    assert [(p["values"]["trainer.lr"], p["values"]["trainer.seed"]) for p in index["points"]] == [
        (1e-3, 1), (1e-3, 2), (3e-3, 1), (3e-3, 2)]
    for p in index["points"]:
        run_dir = Path(p["run_dir"])
        trainer = tomllib.loads((run_dir / "components" / "trainer.toml").read_text())
        assert (trainer["lr"], trainer["seed"], trainer["max_steps"]) == (
            p["values"]["trainer.lr"], p["values"]["trainer.seed"], 7)
        script = (RunDir(run_dir).script).read_text()
        assert f"#SBATCH --job-name={p['name']}" in script and "#SBATCH --time=00:05:00" in script
        assert "rendered from sft.toml" in script.splitlines()[1]
        resolved = tomllib.loads((RunDir(run_dir).recipe).read_text())
        assert "sweep" not in resolved and resolved["name"] == p["name"]
        # a complete run dir: its recipe.toml renders it again (`slurmrl diff` finds nothing), and so does its lock
        assert build(RunDir(run_dir).recipe, run_dir=run_dir, source_name="sft.toml").script == script
        m = lock.meta(run_dir)
        assert (m["sweep"], m["sweep_point"], m["recipe_path"]) == (str(d), p["index"], str(recipe))
        assert build(RunDir(run_dir).lock, run_dir=run_dir).script == script
        assert read_links(run_dir).to_json() == {"sweep": str(d)}
    # a recipe with a [sweep] table is not rendered as one job
    r = slurmrl("render", str(recipe), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("slurmrl: error: sweep: this recipe is a sweep")


@pytest.mark.parametrize("grid, field", [
    (["trainer.lrr=1e-3,2e-3"], "trainer.lrr: unknown key; did you mean 'lr'?"),
    (["trainer.lr=1e-3,fast"], "trainer.lr: should be a valid number"),
    (["trainer.nodes=1,1.5"], "trainer.nodes: should be a valid integer"),
    (["trainer.lr="], "trainer.lr: --grid 'trainer.lr=' gives an empty value"),
    (["trainer.lr=1e-3,,2e-3"], "trainer.lr: --grid 'trainer.lr=1e-3,,2e-3' gives an empty value"),
    (["trainer.lr=1e-3,0.001"], "trainer.lr: lists a value twice"),
    (["trainer.lr=1e-3", "trainer.lr=2e-3"], "trainer.lr: is given twice with --grid"),
    (["name=a,b"], "name: cannot be swept"),
    (["trainer.nodes=1,9"], "trainer.batch_size: a batch of 16 sequences does not split"),  # point 1 cannot plan
    ([], "--grid: no grid"),
])
def test_bad_grids_are_one_line_naming_the_field_and_write_nothing(tmp_path, grid, field):
    r = slurmrl("sweep", str(SFT), *(a for g in grid for a in ("--grid", g)), "--render-only", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(f"slurmrl: error: {field}"), r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_job_array_only_for_plain_jobs_that_ask_for_the_same(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def scripts(recipe, grid):
        d = sweep.render_sweep(recipe, grid, sweep_dir=tmp_path / f"s{len(list(tmp_path.iterdir()))}")
        return d, {p.name: (RunDir(p).script).read_text() for p in sweep.point_dirs(d, sweep.read_index(d))}

    d, same = scripts(SFT, ["trainer.lr=1e-3,3e-3"])
    assert sweep.array_refusal(same) is None
    text = sweep.array_script(d, sweep.read_index(d), next(iter(same.values())), 1)
    assert "#SBATCH --array=0-1%1" in text and "#SBATCH --job-name=sft-debug-sweep" in text
    assert f"#SBATCH --output={d}/sft-debug-p%a/logs/batch-%A_%a.out" in text
    assert "#SBATCH --job-name=sft-debug-p0" not in text and "#SBATCH --gpus-per-node=1" in text
    assert text.rstrip().endswith('exec bash "${POINTS[SLURM_ARRAY_TASK_ID]}/job.sbatch"')
    _, het = scripts(ROOT / "recipes" / "rl-debug.toml", ["orchestrator.seed=0,1"])
    assert "heterogeneous job (2 het groups): Slurm refuses a job array" in sweep.array_refusal(het)
    _, sizes = scripts(SFT, ["slurm.cpus_per_node=4,8"])
    assert "different resources" in sweep.array_refusal(sizes)
    # one job per point: each waits for the one --max-running before it, with the point's own dependency
    plain = next(iter(sizes.values()))
    assert sweep.own_dependency(plain, "p0/job.sbatch") is None
    assert sweep.dependency_for(None, None) == []
    assert sweep.dependency_for(None, "41") == ["--dependency=afterany:41"]
    own = plain.replace("#SBATCH --partition=debug", "#SBATCH --partition=debug\n#SBATCH --dependency=afterok:7")
    assert sweep.dependency_for(sweep.own_dependency(own, "p0/job.sbatch"), "41") == [
        "--dependency=afterok:7,afterany:41"]


def test_array_tasks_in_sacct_and_squeue_rows():
    assert [r["JobID"] for r in array_rows({"JobID": "90_[2-4,7%2]", "State": "PENDING"})] == [
        "90_2", "90_3", "90_4", "90_7"]
    assert [r["id"] for r in array_rows({"id": "90_[0-1]"}, "id")] == ["90_0", "90_1"]
    text = ("JobID|JobName|State|ExitCode|Elapsed|NodeList|Reason\n"
            "90_0|sft|RUNNING|0:0|00:00:09|n1|None\n90_0.batch|batch|RUNNING|0:0|00:00:09|n1|\n"
            "90_0.1|trainer|RUNNING|0:0|00:00:08|n1|\n90_[0-2%1]|sft|PENDING|0:0|00:00:00|None assigned|"
            "JobArrayTaskLimit\n")
    info = HetInfoWatcher().read_info(text)
    assert info["90_0"]["State"] == "RUNNING" and [s["JobName"] for s in info["90_0"]["steps"]] == ["trainer"]
    assert info["90_2"]["State"] == "PENDING" and info["90_2"]["Reason"] == "JobArrayTaskLimit"


def test_plot_draws_every_points_reward_curve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = sweep.render_sweep(ROOT / "recipes" / "rl-debug.toml", ["trainer.lr=1e-6,3e-6"])
    for i, p in enumerate(sweep.point_dirs(d, sweep.read_index(d))):
        (p / "metrics").mkdir()
        (p / "metrics" / "orchestrator.jsonl").write_text(
            "".join(json.dumps({"step": s, "reward_mean": 0.1 * s + i}) + "\n" for s in range(4)))
    r = slurmrl("plot", str(d), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rl-debug-p1  lr=3e-06" in r.stdout and "1.300" in r.stdout  # last reward of point 1
    assert (d / "reward.png").read_bytes()[:4] == b"\x89PNG"
