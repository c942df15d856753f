"""Issue 32 item 5: check, then write, then submit. When sbatch itself fails, every file the submission
touched (lock.toml, the copy of the old lock kept with the last job's logs, the last job's logs, ready
files and probe reports it set aside) is put back byte for byte, and a refused submit or sweep leaves
no folder behind, not even the empty output folders made for it.

Without a cluster, sbatch is a test double that prints no job id (so ``sbatch()`` refuses it); with the
local cluster, the real sbatch fails on a partition that does not exist (``SBATCH_PARTITION``, which
overrides the script's own #SBATCH line after every check of ours has passed)."""

from __future__ import annotations

import json
import os
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

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cluster_double(doubles):
    """The TEST DOUBLES of Slurm's commands (tests/conftest.py), with a scontrol that describes a cluster
    that holds sft-debug (partition debug, four 8-CPU nodes with 4 GPUs); sbatch still prints no job id."""
    scontrol = doubles.parent / "bin" / "scontrol"
    scontrol.write_text("#!/bin/sh\n"
                        'case "$2" in\n'
                        "  partition) echo 'PartitionName=debug Default=YES Nodes=n[1-4] State=UP';;\n"
                        "  node) for n in 1 2 3 4; do echo \"NodeName=n$n CPUTot=8 Gres=gpu:4 State=IDLE "
                        "Partitions=debug\"; done;;\n"
                        "esac\n")
    return doubles


@given(attempts=st.integers(0, 3), runtime=st.booleans(), kept_before=st.booleans(),
       outputs=st.lists(st.sampled_from(list(RunDir.JOB_OUTPUTS)), unique=True))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_failed_sbatch_puts_the_run_dir_back(tmp_path_factory, cluster_double, attempts, runtime, kept_before,
                                               outputs):
    run_dir = render(RECIPE, [f"output_dir={tmp_path_factory.mktemp('run')}"]).run_dir  # rendered where it is
    previous_job(run_dir, attempts, runtime, outputs, kept_before)
    before = tree(run_dir)
    with pytest.raises(UserError, match="sbatch"):
        submit(str(run_dir), [], False, False)
    assert tree(run_dir) == before


def test_a_refused_submit_of_a_recipe_leaves_no_folder(tmp_path, cluster_double, monkeypatch):
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "a" / "b" / "runs"
    with pytest.raises(UserError, match="sbatch"):
        submit(str(RECIPE), [f'output_dir="{out}"'], False, False)
    assert list(work.iterdir()) == []


def test_a_refused_sweep_leaves_no_folder(tmp_path, cluster_double, monkeypatch, capsys):
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "a" / "b" / "s-sweep"
    assert cli.main(["sweep", str(RECIPE), "--grid", "trainer.lr=1e-6,2e-6", "--sweep-dir", str(out)]) == 2
    assert "sbatch" in capsys.readouterr().err
    assert list(work.iterdir()) == []


def test_a_failed_sbatch_puts_a_rendered_sweep_back(tmp_path, cluster_double, capsys):
    sweep_dir = tmp_path / "w" / "s-sweep"
    assert cli.main(["sweep", str(RECIPE), "--grid", "trainer.lr=1e-6,2e-6", "--render-only",
                     "--sweep-dir", str(sweep_dir)]) == 0
    before = tree(sweep_dir)
    with pytest.raises(UserError, match="sbatch"):
        submit_sweep(sweep_dir)
    assert tree(sweep_dir) == before


# ---- the real sbatch fails ------------------------------------------------------------------------------
@pytest.mark.cluster
@pytest.mark.parametrize("runtime", [False, True])
def test_the_real_sbatch_refusing_leaves_the_run_dir_as_it_was(slurm_cluster, tmp_path, monkeypatch,
                                                                runtime):
    for k, v in {**slurm_cluster.cluster_vars, "SBATCH_PARTITION": "no-such-partition"}.items():
        monkeypatch.setenv(k, v)
    run_dir = render(RECIPE, [f"output_dir={tmp_path}"]).run_dir
    previous_job(run_dir, 2, runtime, ["ready"], False)
    (run_dir / "jobs.json").write_text(json.dumps([{"job_id": "1"}]))  # long gone: not in the queue
    before = tree(run_dir)
    with pytest.raises(UserError, match="sbatch"):
        submit(str(run_dir), [], False, False)
    assert tree(run_dir) == before
    out = tmp_path / "new" / "runs"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="sbatch"):
        submit(str(RECIPE), [f'output_dir="{out}"'], False, False)
    assert not (tmp_path / "new").exists()
    assert os.environ["SBATCH_PARTITION"] == "no-such-partition"
