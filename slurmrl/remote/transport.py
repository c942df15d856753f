"""The SSH transport: slurmrl's Slurm commands, run on a cluster's login node over one
multiplexed OpenSSH connection (:mod:`slurmrl.remote.ssh`). The same interface as
``slurmrl.slurm.tools.Local``, so submit, status, logs, cancel and attach do not branch.

The run dir: planned and rendered here for ``WORKDIR/<name>`` on the cluster (the script is the
truth, so it names the cluster's paths), kept here at ``OUTPUT_DIR/<name>`` as usual, and copied
there by ``push`` (rsync over the connection). ``pull`` brings back what the job writes and the
commands read (logs, ready files, preflight reports, benchmark results, metrics); checkpoints,
weights and rollouts stay on the cluster.

Secrets: the job's secret is made on the cluster by the job script (``RUN_DIR/secret``, 0600) and
never leaves it: neither copy includes it. The variables of the cluster's ``forward_env``
(default WANDB_API_KEY, HF_TOKEN) that are set here reach sbatch, whose environment becomes the
job's, as lines on the ssh channel's stdin, read by ``read`` in a ``sh -c`` that then execs sbatch:
never in an argv (here or there) nor in a file slurmrl writes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path, PurePosixPath

from slurmrl.errors import UserError
from slurmrl.remote.clusters import Cluster
from slurmrl.remote.ssh import Connection
from slurmrl.rundir.jobids import check_argv
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.slurm.tools import Local

# what the job writes and the login-node commands read: pulled back, and the only places where
# a push deletes what the cluster has and the run dir here has not (submit sets them aside)
PULLED_DIRS = RunDir.PULLED
PULLED_FILES = (RunDir.ALLOCATIONS,)
NOT_FOUND = 127


class Remote(Local):
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.name = cluster.name
        self.conn = Connection(cluster)

    # ---- Slurm commands -----------------------------------------------------------------------
    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        check_argv(argv)  # call() checked it; a job id must not become an option on the cluster either
        submits = argv[0] == "sbatch" and not {"--help", "--usage", "--version", "-V"} & set(argv)
        command, secrets = shlex.join(argv), self.secrets() if submits else {}
        if secrets:  # sbatch hands its environment to the job: the values come over stdin
            reads = "".join(f"IFS= read -r {k} && export {k} && " for k in secrets)
            command = shlex.join(["sh", "-c", f"{reads}exec {command}"])
        stdin = "".join(f"{v}\n" for v in secrets.values()) if secrets else None
        r = self.conn.run(command, input=stdin, timeout=timeout)
        if r.returncode == NOT_FOUND and "not found" in (r.stderr or ""):
            raise UserError(None, f"{argv[0]} not found on {self.conn.label}: ssh runs commands in a "
                                  "non-login shell there; put Slurm's commands on its PATH (e.g. in ~/.bashrc)")
        return r

    def argv(self, argv: list[str]) -> list[str]:
        check_argv(argv)
        return self.conn.argv(shlex.join(argv))

    def secrets(self) -> dict[str, str]:
        found = {k: os.environ[k] for k in self.cluster.forward_env if os.environ.get(k)}
        for k, v in found.items():
            if "\n" in v or "\r" in v or "\0" in v:
                raise UserError(k, "holds a line break; it is sent to the cluster as one line")
        return found

    # ---- the run dir ----------------------------------------------------------------------------
    def place(self, run_dir: Path) -> Path:
        return Path(PurePosixPath(self.cluster.workdir) / run_dir.name)

    def remote(self, run_dir: Path, trailing: str = "/") -> str:
        return f"{self.cluster.destination}:{self.place(run_dir)}{trailing}"

    def check_rendered_for(self, run_dir: Path) -> None:
        """job.sbatch must run in the cluster's copy: its RUN_DIR line names that path."""
        want = str(self.place(run_dir))
        text = read_text(RunDir(run_dir).script)
        m = re.search(r"^RUN_DIR=(.*)$", text, re.M)
        try:
            found = shlex.split(m.group(1), comments=True)[0] if m else None
        except (ValueError, IndexError):
            found = None
        if found != want:
            raise UserError(str(run_dir), f"job.sbatch runs in RUN_DIR={found}, not in {want} on cluster "
                                          f"{self.name}; render it for the cluster: `slurmrl submit RECIPE "
                                          f"--cluster {self.name}`")

    def push(self, run_dir: Path, only: list[str] | None = None) -> None:
        if only:
            self.conn.rsync(["-rlpt", *(str(run_dir / f) for f in only), self.remote(run_dir)])
            return
        self.check_rendered_for(run_dir)
        workdir = shlex.quote(self.cluster.workdir)
        risk = [f"--filter=R /{d}/***" for d in PULLED_DIRS]
        self.conn.rsync(["-rlpt", "--delete", f"--exclude=/{RunDir.SECRET}", *risk, "--filter=P *",
                         f"--rsync-path=mkdir -p {workdir} && rsync", f"{run_dir}/", self.remote(run_dir)])

    def pull(self, run_dir: Path) -> None:
        if not (RunDir(run_dir).jobs).is_file():
            return  # never submitted: nothing of a job's to bring back
        wanted = [f"--include=/{d}/***" for d in PULLED_DIRS] + [f"--include=/{f}" for f in PULLED_FILES]
        self.conn.rsync(["-rlpt", "--delete", *wanted, "--exclude=*", self.remote(run_dir), f"{run_dir}/"])

    # ---- attach ---------------------------------------------------------------------------------
    def exec(self, argv: list[str], env: dict[str, str], pty: bool) -> None:
        check_argv(argv)
        self.conn.exec(shlex.join(argv), pty)

    def close(self) -> None:
        self.conn.close()
