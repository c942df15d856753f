"""The one ``sbatch`` call: submit and sweep both go through here (over the current transport)."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.rundir.jobids import is_job_id
from slurmrl.slurm import tools


def sbatch(argv: list[str]) -> str:
    """``sbatch --parsable ARGV...`` -> the job id it printed (a UserError when it printed none)."""
    out = tools.out(["sbatch", "--parsable", *argv]).strip()
    job_id = out.splitlines()[-1].split(";")[0] if out else ""
    if not is_job_id(job_id):
        raise UserError(None, f"sbatch printed {out!r}, not a job id")
    return job_id
