"""`slurmrl status`/`cancel` on jobs of the local cluster, and a Python that stands in for the job's
(FAKE_PYTHON: a TEST DOUBLE of the interpreter the rendered script runs); shared by the cluster tests."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

FAKE_PYTHON = f"""#!/bin/bash
# stand-in for python in job steps: every task function execs
# `python -m slurmrl.runtime.steps.supervise NAME ... -- COMMAND`; run the probe for NAME instead
case $2 in slurmrl.runtime.steps.node_start | slurmrl.runtime.steps.attempts) exec {sys.executable} "$@" ;; esac  # as they are
[[ $1 == -m && $2 == slurmrl.runtime.steps.supervise ]] || {{ echo "unexpected: $*"; exit 9; }}
name=$3
if [[ $name == "${{SLURMRL_TEST_FAIL:-}}" ]]; then echo "$name: failing on purpose"; exit 3; fi
if [[ $name == "${{SLURMRL_TEST_RAISE:-}}" ]]; then  # the real supervisor, running a program that raises
    exec {sys.executable} -m slurmrl.runtime.steps.supervise "$name" -- {sys.executable} "$SLURMRL_TEST_PROGRAM"
fi
if [[ $name == "${{SLURMRL_TEST_STALL:-}}" ]]; then echo "$name: never ready"; exec sleep 600; fi
if [[ $name == "${{SLURMRL_TEST_HOLD:-}}" ]]; then
    {sys.executable} -m slurmrl.runtime.steps.probe "$name" || exit $?
    echo "$name: holding"
    exec sleep 600
fi
exec {sys.executable} -m slurmrl.runtime.steps.probe "$name"
"""


def cancel_until_gone(cluster, job_id: str, seconds: float = 90) -> None:
    """scancel until the controller lists the job no more: a cancel that lands while Slurm requeues
    the job (the warning signal's own requeue) is lost, and the job would start again later, taking
    two nodes from the tests after this one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cluster.run(["scancel", str(job_id)])
        left = cluster.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"]).stdout.split()
        if not left or set(left) <= {"CANCELLED", "COMPLETED", "FAILED"}:
            return
        time.sleep(2)


def status_json(cluster, run_dir: Path) -> dict:
    r = cluster.slurmrl("status", str(run_dir), "--json", cwd=run_dir.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)

