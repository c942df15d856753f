"""Undo covers everything a failed submit or sweep rewrote (issue 43): `submit RECIPE` over an existing run
dir, and `sweep RECIPE` over a rendered sweep dir, re-render before sbatch; when sbatch then fails, the
run dir (components/*.toml, plan.json, recipe.toml, lock.toml, job.sbatch, the logs set aside) and the
sweep dir (its points, those the new grid drops and those it adds, sweep.json) are as they were, byte
for byte. A run dir or sweep dir moved elsewhere after it was rendered is refused in one line (its
job.sbatch would write into the old place): it is rendered again for where it is now.

sbatch is the TEST DOUBLE of tests/conftest.py (``doubles``): it prints no job id, so ``sbatch()`` refuses."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollback_runs import RECIPE, previous_job, tree

from slurmrl import cli
from slurmrl.app.build import render
from slurmrl.app.submit import submit
from slurmrl.app.sweep import submit_sweep
from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir

SOME = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# a recipe change that rewrites the render: its numbers, its components, its plan
CHANGES = st.lists(st.sampled_from(["trainer.lr=3e-6", "trainer.micro_batch_size=2", "slurm.time='00:20:00'",
                                    "trainer.max_steps=7", "env.UNDO_TEST='1'", "trainer.seed=5"]),
                   min_size=1, max_size=3, unique=True)


@pytest.fixture
def failing_sbatch(doubles):
    """The doubles of Slurm's commands, with a scontrol describing a cluster that holds sft-debug."""
    (doubles.parent / "bin" / "scontrol").write_text(
        "#!/bin/sh\ncase \"$2\" in\n  partition) echo 'PartitionName=debug Default=YES Nodes=n[1-4] State=UP';;\n"
        "  node) for n in 1 2 3 4; do echo \"NodeName=n$n CPUTot=8 Gres=gpu:4 State=IDLE Partitions=debug\"; done;;\n"
        "esac\n")
    return doubles


def sbatch_calls(log: Path) -> list[list[str]]:
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [c for c in calls if Path(c[0]).name == "sbatch"]


def quiet(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, err.getvalue()


@SOME
@given(changes=CHANGES, ran_before=st.booleans(), hand_note=st.booleans())
def test_a_failed_submit_of_a_recipe_puts_the_earlier_render_back(tmp_path_factory, failing_sbatch, changes,
                                                                   ran_before, hand_note):
    out = tmp_path_factory.mktemp("out")
    run_dir = render(RECIPE, [f"output_dir={out}"]).run_dir
    if ran_before:
        previous_job(run_dir, 1, True, ["ready"], False)
    if hand_note:  # a file of the user's own in a folder the render owns
        (run_dir / "components" / "NOTES.txt").write_text("mine\n")
    before = tree(run_dir)
    with pytest.raises(UserError, match="sbatch"):
        submit(str(RECIPE), [f"output_dir={out}", *changes], True, False)
    assert tree(run_dir) == before


@SOME
@given(first=st.sampled_from(["1e-6,2e-6", "1e-6,2e-6,3e-6"]), second=st.sampled_from(["4e-6", "5e-6,6e-6,7e-6,8e-6"]),
       extra=st.lists(st.sampled_from(["trainer.max_steps=9", "slurm.time='00:30:00'"]), unique=True))
def test_a_failed_sweep_puts_the_earlier_rendered_sweep_back(tmp_path_factory, failing_sbatch, first, second, extra):
    sweep_dir = tmp_path_factory.mktemp("s") / "s-sweep"
    rc, err = quiet(["sweep", str(RECIPE), "--grid", f"trainer.lr={first}", "--render-only", "--sweep-dir",
                     str(sweep_dir)])
    assert rc == 0, err
    before = tree(sweep_dir)
    argv = ["sweep", str(RECIPE), "--grid", f"trainer.lr={second}", "--sweep-dir", str(sweep_dir)]
    for e in extra:
        argv += ["--set", e]
    rc, err = quiet(argv)
    assert rc == 2 and "sbatch" in err, err
    assert tree(sweep_dir) == before


def test_a_moved_run_dir_is_refused_naming_both_places(tmp_path, failing_sbatch):
    run_dir = render(RECIPE, [f"output_dir={tmp_path / 'a'}"]).run_dir
    moved = tmp_path / "b" / run_dir.name
    moved.parent.mkdir()
    run_dir.rename(moved)
    before = tree(moved)
    rc, err = quiet(["submit", str(moved)])
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"slurmrl: error: {moved}: was rendered for {run_dir} (job.sbatch writes there)"), err
    assert tree(moved) == before and not sbatch_calls(failing_sbatch)


def test_a_moved_sweep_dir_is_refused(tmp_path, failing_sbatch):
    first = tmp_path / "a" / "s-sweep"
    rc, err = quiet(["sweep", str(RECIPE), "--grid", "trainer.lr=1e-6,2e-6", "--render-only", "--sweep-dir", str(first)])
    assert rc == 0, err
    moved = tmp_path / "b" / "s-sweep"
    moved.parent.mkdir()
    shutil.move(first, moved)
    before = tree(moved)
    with pytest.raises(UserError, match="was rendered for") as e:
        submit_sweep(moved)
    assert str(first) in e.value.message and tree(moved) == before and not sbatch_calls(failing_sbatch)
    assert not list(moved.glob(f"*/{RunDir.LOCK}.*"))
