"""Run one function of the rendered script's helper file (sbatch/slurmrl-functions.sh) in real bash."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


HELPER = (ROOT / "sbatch" / "slurmrl-functions.sh").read_text()


# ---- Slurm ending the job: a stop, not a failure --------------------------------------------------
def run_helper(tmp_path: Path, body: str, squeue: str, attempt: int = 0) -> tuple[subprocess.CompletedProcess, Path]:
    """``body`` after sourcing the helper, with a squeue double that prints ``squeue`` (a shell line)."""
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "logs" / f"attempt-{attempt}"
    bin_dir.mkdir(exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "squeue").write_text(f"#!/bin/bash\n{squeue}\n")
    (bin_dir / "squeue").chmod(0o755)
    (tmp_path / "f.sh").write_text(HELPER)
    script = (f'set -euo pipefail\nPATH={str(bin_dir)!r}:"$PATH"\nRUN_DIR={str(tmp_path)!r}\n'
              f'LOG_DIR={str(log_dir)!r}\nATTEMPT={attempt}\nSLURM_JOB_ID=42\nWARN_SIGNAL=USR1\n'
              f'GRACE_SECONDS=1\nsource "$RUN_DIR/f.sh" 2\nstop_components() {{ :; }}\n{body}\n')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60), log_dir
