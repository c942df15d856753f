"""`slurmrl` run with the Slurm client commands' test double (tests/support/fake_slurm) first on PATH:
the result and the calls it made; shared by the tests of what a refused or failed submit leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_errors import one_line_error

ROOT = Path(__file__).resolve().parents[2]
SFT = ROOT / "recipes" / "sft-debug.toml"
FAKE = Path(__file__).resolve().parent / "fake_slurm"


def run(*args: str, cwd: Path, fail_after: int | None = None) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """`slurmrl ARGS` with the Slurm test double first on PATH; returns the result and the calls it made."""
    log = cwd / ".fake-slurm.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{FAKE}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_LOG": str(log),
           "PYTHONPATH": str(ROOT)}
    env.pop("FAKE_SBATCH_FAIL", None)
    if fail_after is not None:
        env["FAKE_SBATCH_FAIL"] = str(fail_after)
    r = subprocess.run([sys.executable, "-m", "slurmrl", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    return r, calls


def submitted(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if c[0] == "sbatch" and c[1:] not in (["--help"], ["--version"])]


def rendered_run_dir(tmp_path: Path) -> Path:
    r, _ = run("render", str(SFT), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def error_text(r: subprocess.CompletedProcess) -> str:
    """The one-line error's words, without the ``slurmrl: error: `` before them."""
    return one_line_error(r).removeprefix("slurmrl: error: ").strip()
