"""Check everything, then write, then submit (issue 27 items 5-6), without a cluster: a PATH-prepended
test double stands in for Slurm's commands (tests/support/fake_slurm/, recording every call).

- a sweep refused at any point (rendering it, or checking its submission) writes nothing and submits
  nothing; an sbatch that fails part-way cancels what it submitted and leaves no sweep dir;
- `submit --again` with a refused submission leaves no new run dir and no link in the old one;
- `render` refuses before writing;
- grid values are compared as the recipe reads them; `--max-running` has the [sweep] table's range;
- `validate` checks a recipe with a [sweep] table point by point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_slurm_runs import SFT, error_text, rendered_run_dir, run, submitted

from slurmrl.recipe.sweep import MAX_SWEEP_POINTS


def listing(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))





# ---- sweeps ------------------------------------------------------------------------------------
def test_a_sweep_submits_every_point_through_the_double(tmp_path):
    """The double works: four points of different sizes go as four jobs, chained by --max-running."""
    r, calls = run("sweep", str(SFT), "--grid", "slurm.cpus_per_node=2,4,6,8", "--max-running", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    jobs = submitted(calls)
    assert len(jobs) == 4 and jobs[2][2] == "--dependency=afterany:1001" and jobs[3][2] == "--dependency=afterany:1002"
    index = json.loads((tmp_path / "runs" / "sft-debug-sweep" / "sweep.json").read_text())
    assert index["submissions"][-1]["job_ids"] == ["1001", "1002", "1003", "1004"]


@pytest.mark.parametrize("grid, field", [
    # point 3 of 4 cannot be planned: 16 sequences do not split over 9 nodes
    ("trainer.nodes=1,2,4,9", "trainer.batch_size"),
    # point 3 of 4 is rendered but the cluster cannot hold it (checked before anything is written)
    ("slurm.cpus_per_node=2,4,8,128", "group 0"),
])
def test_a_sweep_refused_at_its_last_point_writes_nothing_and_submits_nothing(tmp_path, grid, field):
    before = listing(tmp_path)
    r, calls = run("sweep", str(SFT), "--grid", grid, cwd=tmp_path)
    assert error_text(r).startswith(field)
    assert listing(tmp_path) == before  # no sweep dir, no point dir
    assert submitted(calls) == [] and not any(c[0] == "scancel" for c in calls)


def test_an_any_of_dependency_is_refused_before_the_first_point_is_submitted(tmp_path):
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT.read_text())
    r, _ = run("sweep", str(recipe), "--grid", "slurm.cpus_per_node=2,4,6", "--render-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = tmp_path / "runs" / "sft-debug-sweep"
    last = d / "sft-debug-p2" / "job.sbatch"
    last.write_text(last.read_text().replace("#SBATCH --partition=debug",
                                             "#SBATCH --partition=debug\n#SBATCH --dependency=afterok:7?afterok:8"))
    r, calls = run("sweep", str(d), "--max-running", "1", cwd=tmp_path)
    assert error_text(r).startswith("slurm.dependency: sft-debug-p2/job.sbatch")
    assert submitted(calls) == []
    assert not (d / "sft-debug-p0" / "jobs.json").exists() and json.loads((d / "sweep.json").read_text())[
        "submissions"] == []


@pytest.mark.parametrize("grid", ["slurm.cpus_per_node=2,4,6,8", "trainer.lr=1e-3,2e-3,3e-3,4e-3"])
def test_an_sbatch_failing_part_way_cancels_what_it_submitted_and_leaves_no_sweep_dir(tmp_path, grid):
    """Jobs (different sizes: one sbatch per point) and a job array (same size: one sbatch) alike."""
    r, calls = run("sweep", str(SFT), "--grid", grid, cwd=tmp_path, fail_after=2 if "cpus" in grid else 0)
    line = error_text(r)
    assert "Batch job submission failed" in line
    if "cpus" in grid:
        assert len(submitted(calls)) == 3 and ["scancel", "--", "1001", "1002"] in calls and "cancelled: 1001 1002" in line
    else:
        assert len(submitted(calls)) == 1 and not any(c[0] == "scancel" for c in calls)
    assert not (tmp_path / "runs").exists() or listing(tmp_path / "runs") == []


# ---- submit --again and render ---------------------------------------------------------------------
@pytest.mark.parametrize("links", [None, '{"sweep": "/somewhere/else"}\n'])
def test_submit_again_with_a_failing_sbatch_leaves_no_new_run_dir_and_no_link(tmp_path, links):
    old = rendered_run_dir(tmp_path)
    if links is not None:
        (old / "links.json").write_text(links)
    before = {p: (old / p).read_bytes() for p in listing(old) if (old / p).is_file()}
    r, calls = run("submit", "--again", str(old), cwd=tmp_path, fail_after=0)
    assert "Batch job submission failed" in error_text(r)
    assert len(submitted(calls)) == 1
    assert sorted(p.name for p in old.parent.iterdir()) == [old.name]  # no RUN_DIR-again-1, no temp dir
    assert {p: (old / p).read_bytes() for p in listing(old) if (old / p).is_file()} == before


def test_submit_again_that_the_cluster_cannot_hold_leaves_nothing(tmp_path):
    old = rendered_run_dir(tmp_path)
    script = old / "job.sbatch"
    script.write_text(script.read_text().replace("#SBATCH --nodes=1", "#SBATCH --nodes=40"))
    r, calls = run("submit", "--again", str(old), cwd=tmp_path)
    assert error_text(r).startswith("group 0")
    assert submitted(calls) == [] and sorted(p.name for p in old.parent.iterdir()) == [old.name]
    assert not (old / "links.json").exists()


def test_submit_again_links_both_ways_when_it_is_submitted(tmp_path):
    old = rendered_run_dir(tmp_path)
    r, calls = run("submit", "--again", str(old), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    new = old.parent / f"{old.name}-again-1"
    assert json.loads((old / "links.json").read_text()) == {"again_as": [str(new)]}
    assert json.loads((new / "jobs.json").read_text())[-1]["job_id"] == "1001"


def test_render_refused_writes_nothing(tmp_path):
    r, _ = run("render", str(SFT), "--set", "trainer.nodes=9", cwd=tmp_path)
    assert error_text(r).startswith("trainer.batch_size")
    assert listing(tmp_path) == []


# ---- grid values as the recipe reads them, --max-running, validate -------------------------------
@pytest.mark.parametrize("grid", ["trainer.lr=1e-4,0.0001", "trainer.lr=1,1.0", "trainer.max_steps=5,5.0",
                                  "slurm.time=00:05:00,'00:05:00'", "trainer.max_steps=3,4,3.0"])
def test_grid_values_the_recipe_reads_as_one_are_refused_naming_the_key(tmp_path, grid):
    r, calls = run("sweep", str(SFT), "--grid", grid, "--grid", "trainer.seed=1,2", cwd=tmp_path)
    line = error_text(r)
    # a whole number written as a float is refused for an integer field before the grid's duplicate check
    assert line.startswith(grid.split("=")[0] + ": ") and ("twice" in line or "without a decimal point" in line)
    assert listing(tmp_path) == [] and submitted(calls) == []


def test_a_sweep_table_with_values_the_recipe_reads_as_one_is_refused(tmp_path):
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT.read_text() + '\n[sweep]\ngrid = { "trainer.max_steps" = [2, 2.0] }\n')
    for verb in ("sweep", "validate"):
        r, _ = run(verb, str(recipe), cwd=tmp_path)
        line = error_text(r)
        assert line.startswith("trainer.max_steps: ") and ("twice" in line or "without a decimal point" in line)
    assert listing(tmp_path) == ["sft.toml"]


@pytest.mark.parametrize("value, why", [
    ("0", "out of range"), ("-1", "out of range"), (str(MAX_SWEEP_POINTS + 1), "out of range"), ("99999999999999999999", "out of range"),
    ("two", "needs a number of jobs"), ("1.5", "needs a number of jobs"), ("", "needs a number of jobs"),
    ("nan", "needs a number of jobs"),
])
def test_max_running_has_the_sweep_tables_range_and_a_one_line_error(tmp_path, value, why):
    r, calls = run("sweep", str(SFT), "--grid", "trainer.seed=1,2", f"--max-running={value}", cwd=tmp_path)
    line = error_text(r)
    assert line.startswith("--max-running: ") and why in line and "usage:" not in r.stderr
    assert listing(tmp_path) == [] and submitted(calls) == []


def test_max_running_at_the_top_of_its_range_is_taken(tmp_path):
    r, _ = run("sweep", str(SFT), "--grid", "trainer.seed=1,2", "--max-running", str(MAX_SWEEP_POINTS),
               "--render-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "runs" / "sft-debug-sweep" / "sweep.json").read_text())["max_running"] == (
        MAX_SWEEP_POINTS)


def test_validate_checks_a_sweep_recipe_point_by_point(tmp_path):
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT.read_text() + '\n[sweep]\ngrid = { "trainer.lr" = [1e-3, 3e-3] }\nmax_running = 1\n')
    r, calls = run("validate", str(recipe), cwd=tmp_path)
    assert (r.returncode, r.stdout, calls) == (0, "", []), r.stderr
    recipe.write_text(SFT.read_text() + '\n[sweep]\ngrid = { "trainer.nodes" = [1, 9] }\n')
    line = error_text(run("validate", str(recipe), cwd=tmp_path)[0])
    assert line.startswith("trainer.batch_size") and "(sweep point 1: trainer.nodes=9)" in line
    recipe.write_text(SFT.read_text() + '\n[sweep]\ngrid = { "trainer.lr" = [1e-3] }\nmax_running = 0\n')
    assert error_text(run("validate", str(recipe), cwd=tmp_path)[0]).startswith("sweep.max_running")
    assert listing(tmp_path) == ["sft.toml"]


def test_validate_takes_a_sweep_table_without_a_grid(tmp_path):
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT.read_text() + "\n[sweep]\nmax_running = 2\n")
    r, _ = run("validate", str(recipe), cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


# ---- a sweep index read back: one line naming it, never a traceback, never a shell line ---------
@pytest.mark.parametrize("edit", [
    lambda ix: ix.update(name="x\n#SBATCH --wrap=touch /tmp/pwned"),
    lambda ix: ix.update(name=7),
    lambda ix: ix["points"][1].update(name="../../etc"),
    lambda ix: ix["points"][1].pop("name"),
    lambda ix: ix["points"].__setitem__(0, "p0"),
    lambda ix: ix["points"][1].update(name=ix["points"][0]["name"]),
    lambda ix: ix["points"][0].update(values=[1, 2]),
    lambda ix: ix["points"][0].update(index="zero"),
    lambda ix: ix.update(grid=[1]),
    lambda ix: ix.update(max_running=0),
    lambda ix: ix.update(max_running="2"),
    lambda ix: ix.update(submissions={"a": 1}),
])
def test_a_hand_edited_sweep_index_is_one_line_for_every_verb(tmp_path, edit):
    r, _ = run("sweep", str(SFT), "--grid", "trainer.lr=1e-3,2e-3", "--render-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = tmp_path / "runs" / "sft-debug-sweep"
    index = json.loads((d / "sweep.json").read_text())
    edit(index)
    (d / "sweep.json").write_text(json.dumps(index))
    for args in (["sweep", str(d)], ["status", str(d)], ["cancel", str(d)], ["plot", str(d)]):
        r, calls = run(*args, cwd=tmp_path)
        assert error_text(r).startswith(str(d / "sweep.json")), args  # the file named first
        assert submitted(calls) == [] and not any(c[0] == "scancel" for c in calls)
    assert not (d / "sweep.sbatch").exists()


def test_a_job_id_read_back_from_a_point_never_reaches_scancel_as_an_option(tmp_path):
    r, _ = run("sweep", str(SFT), "--grid", "trainer.lr=1e-3,2e-3", "--render-only", cwd=tmp_path)
    d = tmp_path / "runs" / "sft-debug-sweep"
    jobs_file = d / "sft-debug-p1" / "jobs.json"
    jobs_file.write_text(json.dumps([{"job_id": "--user=root", "script_sha256": "x"}]))
    r, calls = run("cancel", str(d), cwd=tmp_path)
    assert error_text(r).startswith(str(jobs_file))
    assert not any(c[0] == "scancel" for c in calls)


@pytest.mark.parametrize("links", ["not json", "[1, 2]", '{"again_as": 5}', '{"again_as": [1]}', '{"again_as": "x"}',
                                   '{"again_of": ["a"]}', "\xff\xfe"])
def test_submit_again_refuses_a_bad_links_file_before_writing_anything(tmp_path, links):
    old = rendered_run_dir(tmp_path)
    (old / "links.json").write_bytes(links.encode("latin-1"))
    r, calls = run("submit", "--again", str(old), cwd=tmp_path)
    assert error_text(r).startswith(str(old / "links.json"))
    assert submitted(calls) == [] and sorted(p.name for p in old.parent.iterdir()) == [old.name]
    assert (old / "links.json").read_bytes() == links.encode("latin-1")


def test_submit_of_a_recipe_that_sbatch_refuses_leaves_no_new_run_dir(tmp_path):
    r, calls = run("submit", str(SFT), cwd=tmp_path, fail_after=0)
    assert "Batch job submission failed" in error_text(r) and len(submitted(calls)) == 1
    assert not (tmp_path / "runs").exists() or listing(tmp_path / "runs") == []
    # a run dir that was there before (rendered, not submitted) stays, as rendered
    run_dir = rendered_run_dir(tmp_path)
    before = {p: (run_dir / p).read_bytes() for p in listing(run_dir) if (run_dir / p).is_file()}
    r, _ = run("submit", str(run_dir), cwd=tmp_path, fail_after=0)
    assert "Batch job submission failed" in error_text(r)
    assert sorted(before) == sorted(p for p in listing(run_dir) if (run_dir / p).is_file())
    assert not (run_dir / "jobs.json").exists()


def test_submit_of_a_recipe_keeps_the_hand_edits_of_its_rendered_run_dir(tmp_path):
    """`submit RECIPE` renders over RUN_DIR as `render` does: a hand edit is never dropped silently."""
    run_dir = rendered_run_dir(tmp_path)
    script = run_dir / "job.sbatch"
    script.write_text(script.read_text() + "# my edit\n")
    r, calls = run("submit", str(SFT), cwd=tmp_path)
    assert "job.sbatch" in error_text(r) and submitted(calls) == []
    assert script.read_text().endswith("# my edit\n")
    r, calls = run("submit", str(SFT), "--force", cwd=tmp_path)  # --force renders over it and submits
    assert r.returncode == 0, r.stderr
    assert len(submitted(calls)) == 1 and not script.read_text().endswith("# my edit\n")
