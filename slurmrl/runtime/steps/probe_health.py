"""The node check's health probe: short, before the components start, so that a bad node is named
before the job spends its time on it.

Checks: the run dir is writable from this node; with ``nvidia-smi`` on PATH, every GPU of this step
answers a query within ``GPU_QUERY_S`` and the step sees as many as Slurm gave it; where the job runs
in a container (``--container``: the node check runs in it), the image started on this node (enroot's
``/.lock`` is there; slurmrl.runtime.steps.container); over the step's nodes, a small all-reduce
(slurmrl.runtime.steps.probe_allreduce, a process of its own with a deadline), which names a node that
does not join. Without nvidia-smi (a CPU node, the local cluster's fake GPUs) the GPU parts are skipped,
under the Pyxis test double (the local Slurm has no Pyxis) the container part, and without torch where
the probe runs the all-reduce: the report says so. Never a failure of the job for the probe's own trouble."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from slurmrl.runtime.steps import container, probe_allreduce, tree

GPU_QUERY_S = 30.0
ALLREDUCE_S = probe_allreduce.DEADLINE_S


@dataclass
class Health:
    problems: list[str] = field(default_factory=list)  # of this node
    notes: list[str] = field(default_factory=list)
    others: dict[str, str] = field(default_factory=dict)  # other nodes the all-reduce names bad: node -> why


def step_gpus() -> list[str]:
    value = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    return [g for g in value.split(",") if g.strip()]


def check_gpus(h: Health) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        h.notes.append("GPU checks skipped: no nvidia-smi on this node (a CPU node)")
        return
    want = step_gpus()
    argv = [smi, "--query-gpu=index,name", "--format=csv,noheader"] + (["-i", ",".join(want)] if want else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=GPU_QUERY_S)
    except subprocess.TimeoutExpired:
        h.problems.append(f"nvidia-smi did not answer within {GPU_QUERY_S:.0f}s")
        return
    if done.returncode != 0:
        h.problems.append(f"nvidia-smi failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[:200]}")
        return
    seen = [line for line in done.stdout.splitlines() if line.strip()]
    if len(seen) < len(want):
        h.problems.append(f"{len(seen)} GPU(s) answer of the {len(want)} Slurm gave this step ({','.join(want)})")
    else:
        h.notes.append(f"{len(seen)} GPU(s) answer")


def check_writable(h: Health, folder: Path) -> None:
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".health-"):
            pass
    except OSError as e:
        h.problems.append(f"cannot write to {folder}: {e.strerror or e}")


def check_container(h: Health) -> None:
    """The job runs in a container and this check runs in it: did the image start on this node?"""
    seen = container.observe()
    if seen.test_double:
        h.notes.append("container check skipped: the Pyxis test double runs no image (no Pyxis on this cluster)")
    elif seen.enroot_lock:
        h.notes.append(f"container started ({seen.rootfs or 'enroot'})")
    else:
        h.problems.append("the job asks for a container, but this node ran the check outside one (no enroot /.lock)")


class AllReduce:
    """The all-reduce across the step's nodes, in a process of its own (torch's import, a deadline), started
    before the rest of the node check so that torch's import overlaps the cleanup."""

    def __init__(self, timeout_s: float = ALLREDUCE_S):
        self.timeout_s = timeout_s
        world = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)
        argv = [sys.executable, "-m", "slurmrl.runtime.steps.probe_allreduce", "--timeout", str(timeout_s)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) if world > 1 else None

    def check(self, h: Health, node: str) -> None:
        if self.proc is None:
            h.notes.append("all-reduce skipped: one node in this step")
            return
        try:
            stdout, stderr = self.proc.communicate(timeout=self.timeout_s + 60)
        except subprocess.TimeoutExpired:
            tree.kill(self.proc.pid)  # the probe and anything it started
            self.proc.communicate()
            h.notes.append(f"all-reduce probe did not end within {self.timeout_s + 60:.0f}s; skipped")
            return
        lines = stdout.strip().splitlines()
        try:
            out = json.loads(lines[-1]) if lines else None
        except ValueError:
            out = None
        if not isinstance(out, dict):
            said = " ".join((stderr or stdout).split())[-300:]
            h.notes.append(f"all-reduce probe said nothing (exit {self.proc.returncode}): {said}; skipped")
            return
        h.notes += [str(n) for n in out.get("notes") or []]
        for bad, why in (out.get("faults") or {}).items():
            if bad == node:
                h.problems.append(str(why))
            else:
                h.others[str(bad)] = str(why)

    def cancel(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            tree.kill(self.proc.pid)  # the probe and anything it started
            self.proc.communicate()


def probe(log_dir: Path, node: str = "", in_container: bool = False, allreduce: AllReduce | None = None) -> Health:
    """Every check; the all-reduce's (started earlier) result when ``allreduce`` is given."""
    h = Health()
    check_writable(h, log_dir)
    check_gpus(h)
    if in_container:
        check_container(h)
    if allreduce is not None:
        allreduce.check(h, node)
    return h
