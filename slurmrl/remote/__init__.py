"""Working from a laptop: ``--cluster NAME`` on submit, status, logs, cancel and attach.

Plan and render here, copy the run dir to the cluster, drive sbatch/squeue/sacct/scancel/srun
there over one multiplexed OpenSSH connection. The clusters file (:mod:`.clusters`) says where
NAME is; :mod:`.ssh` holds the connection; :mod:`.transport` is the SSH transport the Slurm
commands run through (``slurmrl.slurm.tools`` has the local one). Standard library only: the
CLI path stays light.
"""

from __future__ import annotations

from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.jobs import history
from slurmrl.rundir.paths import RunDir
from slurmrl.slurm.tools import Local


def recorded_cluster(target: str | None) -> str | None:
    """The cluster a run dir's last job went to (``cluster`` in its jobs.json), when ``target``
    (or the current directory) is a run dir; None otherwise, or when anything is unreadable (the
    command itself then says what is wrong)."""
    path = Path(target) if target else Path.cwd()
    if path.is_file() and path.name in (RunDir.SCRIPT, RunDir.JOBS):
        path = path.parent
    try:
        found = history(path)
    except UserError:
        return None
    return found[-1].cluster if found else None


def transport_for(name: str | None, target: str | None) -> Local:
    """``--cluster NAME``, else the cluster the run dir's last job went to, else this machine."""
    recorded = recorded_cluster(target)
    if name and recorded and name != recorded:
        raise UserError("--cluster", f"{target or '.'}'s last job was submitted to cluster {recorded!r}, "
                                     f"not {name!r}")
    name = name or recorded
    if not name:
        return Local()
    from slurmrl.remote.clusters import load
    from slurmrl.remote.transport import Remote

    return Remote(load(name))
