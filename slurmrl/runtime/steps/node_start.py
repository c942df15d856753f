"""The node check, one task per node of the job before anything else starts on it:

    python3 -m slurmrl.runtime.steps.node_start [--container]     (job.sbatch's node check step)

First it turns away a node the run excluded (Slurm placed a requeued job there before the exclusion
reached it), then ends what earlier slurmrl jobs left on the node (slurmrl.runtime.steps.cleanup),
then runs the health probe (slurmrl.runtime.steps.probe_health; ``--container``: the job runs in a
container, and this check in it). Everything is logged to the step's output
(LOG_DIR/nodes.g<n>.<task>.log). A node the probe finds bad (this one, or another that did not join the
all-reduce) is added to the attempt's NODE_FAULTS (``<node> <reason>``) and the task exits 3: the script
then excludes it and requeues the job.
Reads SLURMD_NODENAME, SLURM_JOB_ID, SLURMRL_JOB_IDS, SLURMRL_ATTEMPT, RUN_DIR and PORT_CLAIMS."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from slurmrl.contract import attempt_end, job_env
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps import cleanup, probe_health
from slurmrl.runtime.steps.attempts import excluded_nodes

NODE_FAULT = 3


def fault(paths: RunDir, attempt: int, node: str, why: str) -> int:
    print(f"{node}: BAD: {why}", flush=True)
    attempt_end.append_fault(paths.node_faults(attempt), node, why)
    return NODE_FAULT


def main(argv: list[str]) -> int:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    job_ids = {os.environ.get("SLURM_JOB_ID", ""), *os.environ.get(job_env.JOB_IDS, "").split(",")} - {""}
    attempt = int(os.environ.get(job_env.ATTEMPT) or 0)
    paths = RunDir(os.environ["RUN_DIR"])
    excluded = excluded_nodes(paths.path)
    if node in excluded:
        return fault(paths, attempt, node, f"excluded by this run earlier ({excluded[node]})")
    began = time.monotonic()
    allreduce = probe_health.AllReduce()  # torch's import goes on beside the cleanup
    claims = Path(os.environ.get("PORT_CLAIMS") or "/dev/shm/slurmrl-ports")
    try:
        ended = cleanup.clean(node, job_ids, attempt, claims)
    except BaseException:
        allreduce.cancel()
        raise
    for line in ended or ["nothing left by earlier jobs"]:
        print(f"{node}: cleanup: {line}", flush=True)
    health = probe_health.probe(paths.log_dir(attempt), node, "--container" in argv, allreduce)
    for note in health.notes:
        print(f"{node}: health: {note}", flush=True)
    for other, why in health.others.items():
        fault(paths, attempt, other, f"node check (seen from {node}): {why}")
    if health.problems:
        return fault(paths, attempt, node, "node check: " + "; ".join(health.problems))
    print(f"{node}: health: ok (the node check took {time.monotonic() - began:.1f}s)", flush=True)
    return NODE_FAULT if health.others else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
