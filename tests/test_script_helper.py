"""The helper file job.sbatch sources (RUN_DIR/slurmrl-functions.sh), run in bash: the requeue
decision reads what job.sbatch sets (MAX_REQUEUES empty: requeue off; MAX_TOTAL_SECONDS), and a
helper of another version refuses to load."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from slurmrl.app.build import build

ROOT = Path(__file__).resolve().parent.parent
HELPER = (ROOT / "sbatch" / "slurmrl-functions.sh").read_text()


def refusal(tmp_path: Path, **env: str) -> str:
    (tmp_path / "logs" / "attempt-0").mkdir(parents=True, exist_ok=True)
    (tmp_path / "logs" / "attempt-0" / "phases").write_text("1000 allocation\n")
    (tmp_path / "f.sh").write_text(HELPER)
    sets = "".join(f"{k}={v!r}\n" for k, v in env.items())
    body = f'RUN_DIR={str(tmp_path)!r}\nsource "$RUN_DIR/f.sh" 1\n{sets}requeue_refusal\necho "[$REFUSAL]"\n'
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize(("env", "expected"), [
    ({"MAX_REQUEUES": "", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "0"}, "[slurm.requeue is off]"),
    ({"MAX_REQUEUES": "3", "UP": "1", "ATTEMPT": "0"}, "[not a batch job (bash job.sbatch inside salloc)]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "0", "ATTEMPT": "0"},
     "[it came before every component was ready; another attempt would start over the same way]"),
    ({"MAX_REQUEUES": "2", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "2"},
     "[requeued 2 time(s) already: slurm.max_requeues]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "1"}, "[]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "1", "MAX_TOTAL_SECONDS": "60"},
     "[the job has run 60 s over all attempts: slurm.max_total_time]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "1", "MAX_TOTAL_SECONDS": "99999999999"}, "[]"),
])
def test_requeue_refusal_reads_what_the_script_sets(tmp_path, env, expected):
    assert refusal(tmp_path, **env) == expected


def test_the_script_sets_what_the_requeue_decision_reads(tmp_path):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    off = build(recipe, ["slurm.requeue=false"], run_dir=tmp_path / "a").script
    assert re.search(r'^MAX_REQUEUES="" ', off, re.M) and "MAX_TOTAL_SECONDS" not in off
    capped = build(recipe, ['slurm.max_total_time="3-00:00:00"', "slurm.max_requeues=5"], run_dir=tmp_path / "b").script
    assert re.search(r"^MAX_REQUEUES=5 ", capped, re.M) and re.search(r"^MAX_TOTAL_SECONDS=259200 ", capped, re.M)
    assert re.search(r"^WARN_SIGNAL=USR1 ", capped, re.M)


def test_a_helper_of_another_version_refuses_to_load(tmp_path):
    (tmp_path / "f.sh").write_text(HELPER)
    r = subprocess.run(["bash", "-c", f'set -e\nsource {str(tmp_path / "f.sh")!r} 2\necho loaded'],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "loaded" not in r.stdout
    assert r.stderr.strip() == "slurmrl: job.sbatch asks for slurmrl-functions.sh version 2; this is version 1"
