"""Issue 32 item 3: every ``#SBATCH`` line and every path of every rendered script goes through the one
quoting filter (slurmrl.render.quoting: ``sbatch_value`` for #SBATCH lines, ``shq`` for bash), and the
local Slurm's own sbatch reads back the path we meant.

Script kinds: a run dir's job.sbatch, and a sweep's sweep.sbatch (the job array). Each is rendered
with a hostile run dir or sweep dir (spaces, '#', quotes, '$', backticks, ';', '*', '!', unicode, a
leading '-'), submitted held (``sbatch --hold``: nothing runs), and ``scontrol show job`` must name
the job's output file inside that very folder; the job is cancelled. Paths Slurm cannot carry in a
log file name ('%', a backslash) and line breaks are refused in one line before anything is written."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from quoting_harness import sbatch_options

from slurmrl.app.build import render
from slurmrl.app.sweep import array_script, render_points
from slurmrl.app.sweep_dir import write_sweep_dir
from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent
PLAIN = ROOT / "slurmrl" / "recipes" / "sft-debug.toml"  # one het group: a job array may hold it
HOSTILE = st.text(alphabet=st.sampled_from(list(" #'\"$`;&*!?()[]{}<>|~=,:é中-_.ab")), min_size=1, max_size=12)


def on_slurm(test):
    """A few hostile names (each submits a job), and the ones that broke sbatch before."""
    test = example(name="-rf #")(example(name=" a b#c")(example(name="it's \"q\" $HOME `id`")(test)))
    return settings(max_examples=8, deadline=None, suppress_health_check=[
        HealthCheck.function_scoped_fixture, HealthCheck.too_slow])(given(name=HOSTILE)(test))


REFUSED = ["a%b", "50%", "a\\b", "x\ny", "x\ry", "t\tab"]


def leaf(text: str) -> str:
    """A folder name: no '/', not '.' or '..'."""
    return "d" + text.replace("/", "_")


def sbatch_held(cluster, script: Path) -> str:
    r = cluster.run(["sbatch", "--hold", "--parsable", str(script)], cwd=script.parent)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def show_job(cluster, job_id: str) -> str:
    r = cluster.run(["scontrol", "show", "job", "-o", job_id])
    assert r.returncode == 0, r.stderr
    return r.stdout


def std_out(record: str) -> str:
    """StdOut= of ``scontrol show job -o`` (a path may hold spaces: up to the next ' StdIn=' / ' Power=' field)."""
    m = re.search(r"\bStdOut=(.*?) (?:Power|StdIn|TresPerNode|MailUser|CpusPerTres|Reservation)=", record + " Power=")
    assert m, record
    return m.group(1)


@pytest.mark.cluster
@on_slurm
@example(name="-rf #")
def test_job_sbatch_output_path_as_sbatch_reads_it(slurm_cluster, tmp_path_factory, name):
    base = tmp_path_factory.mktemp("paths")
    run_dir = base / leaf(name)
    out = render(PLAIN, [f"output_dir={base}"], run_dir=run_dir)
    assert out.run_dir == run_dir
    job_id = sbatch_held(slurm_cluster, RunDir(run_dir).script)
    try:
        record = show_job(slurm_cluster, job_id)
        assert std_out(record) == f"{run_dir}/logs/batch-{job_id}.out", record
    finally:
        slurm_cluster.run(["scancel", job_id])


@pytest.mark.cluster
@on_slurm
def test_sweep_array_output_path_as_sbatch_reads_it(slurm_cluster, tmp_path_factory, name):
    base = tmp_path_factory.mktemp("sweeps")
    sweep_dir = base / leaf(name)
    sweep = render_points(PLAIN, ["trainer.lr=1e-6,2e-6"], sweep_dir=sweep_dir)
    write_sweep_dir(sweep.sweep_dir, sweep.points, sweep.index)
    first = next(iter(sweep.points.values()))[RunDir.SCRIPT]
    script = RunDir(sweep_dir).sweep_script
    script.write_text(array_script(sweep_dir, sweep.index, first, None))
    job_id = sbatch_held(slurm_cluster, script)
    try:
        record = show_job(slurm_cluster, job_id)
        point = sweep.index["points"][0]["name"]
        got = std_out(record)
        # a pending array is one record: Slurm fills %a with its "no value" number, the same in both places
        assert re.fullmatch(re.escape(f"{sweep_dir}/{point[:-1]}") + r"(\d+)/logs/batch-" + re.escape(job_id)
                            + r"_\1\.out", got), record
        assert f"JobName={sweep.index['name']}-sweep " in record
    finally:
        slurm_cluster.run(["scancel", job_id])


# ---- what cannot be carried is refused before anything is written (no cluster needed) --------------------
@pytest.mark.parametrize("bad", REFUSED)
def test_a_run_dir_slurm_cannot_name_is_refused(tmp_path, bad):
    with pytest.raises(UserError, match="output_dir") as e:
        render(PLAIN, [f"output_dir={tmp_path}"], run_dir=tmp_path / f"r{bad}")
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", REFUSED)
def test_a_sweep_dir_slurm_cannot_name_is_refused(tmp_path, bad):
    with pytest.raises(UserError, match="sweep-dir") as e:
        render_points(PLAIN, ["trainer.lr=1e-6,2e-6"], sweep_dir=tmp_path / f"s{bad}")
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


@given(name=HOSTILE)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_array_script_directives_are_quoted(tmp_path_factory, name):
    """Without a cluster: every #SBATCH value of sweep.sbatch reads back (as sbatch reads a line) as written."""
    base = tmp_path_factory.mktemp("arr")
    sweep_dir = base / leaf(name)
    sweep = render_points(PLAIN, ["trainer.lr=1e-6,2e-6"], sweep_dir=sweep_dir)
    first = next(iter(sweep.points.values()))[RunDir.SCRIPT]
    text = array_script(sweep_dir, sweep.index, first, 1)
    opts = sbatch_options(text)[0]
    point = sweep.index["points"][0]["name"][:-1]
    assert f"--output={sweep_dir}/{point}%a/logs/batch-%A_%a.out" in opts, opts
    assert "--array=0-1%1" in opts
    r = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr
    shutil.rmtree(base)
