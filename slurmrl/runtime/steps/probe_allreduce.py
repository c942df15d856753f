"""The node check's all-reduce: every node of the step (one task per node) joins one small all-reduce,
so that a node that cannot reach the others is named before the job spends its time.

    python -m slurmrl.runtime.steps.probe_allreduce [--timeout S]   (run by slurmrl.runtime.steps.node_start)

torch.distributed with gloo on the CPU (NCCL where the step has GPUs that torch sees). Rank 0 hosts a
TCPStore on a port the kernel picks (the node check runs before the port table's block is claimed) and
writes ``<host> <port>`` to the attempt's log folder (RunDir.allreduce_address, on the shared run dir);
each rank connects and says it joined; once every rank has, rank 0 says go and they all-reduce a
tensor of ones, whose sum must be the number of nodes. A rank that has not joined within the deadline
is named by rank 0 as the bad node; a rank that finds no rank 0 within the deadline names rank 0's
node. Prints one JSON line: ``{"notes": [...], "faults": {node: why}, "seconds": S}``; exits 5 when torch
cannot be imported here (the node check says so and skips the all-reduce, never failing the job for it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time

from slurmrl.contract import job_env
from slurmrl.rundir.paths import RunDir

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # a container or Python without torch: the check is skipped, and says so
    torch = None  # type: ignore[assignment]
    NO_TORCH = f"{type(e).__name__}: {e}"
else:
    NO_TORCH = ""

DEADLINE_S = 60.0  # for every node to join: tasks of one step start within seconds, torch's import included
POLL_S = 0.05
NO_TORCH_EXIT = 5


def step_hosts() -> list[str]:
    """The step's nodes in rank order (one task per node); [] when Slurm cannot say."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or ""
    if "[" not in nodelist:
        return [n for n in nodelist.split(",") if n]
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def node_of(rank: int, hosts: list[str]) -> str:
    return hosts[rank] if rank < len(hosts) else f"rank {rank}'s node"


def wait_for_address(path, deadline: float) -> tuple[str, int] | None:
    while time.monotonic() < deadline:
        try:
            host, port = path.read_text().split()
            return host, int(port)
        except (OSError, ValueError):
            time.sleep(POLL_S)
    return None


def wait_keys(store, keys: list[str], deadline: float) -> list[str]:
    """Those of ``keys`` still missing from ``store`` at ``deadline`` (polls: a missing rank is named)."""
    missing = list(keys)
    while missing and time.monotonic() < deadline:
        missing = [k for k in missing if not store.check([k])]
        if missing:
            time.sleep(POLL_S)
    return missing


def all_reduce(store, rank: int, world: int, timeout_s: float) -> str | None:
    """The all-reduce itself; None when it summed right, else what went wrong."""
    gpus = torch.cuda.is_available() and not job_env.trainer_on_cpu()
    backend = "nccl" if gpus else "gloo"
    device = torch.device("cuda", 0) if gpus else torch.device("cpu")
    dist.init_process_group(backend, store=dist.PrefixStore("allreduce", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        got = t.item()
    finally:
        dist.destroy_process_group()
    return None if got == world else f"the {backend} all-reduce summed {got:g}, not {world}"


def run(timeout_s: float) -> dict:
    start = time.monotonic()
    deadline = start + timeout_s
    rank = int(os.environ.get("SLURM_PROCID") or 0)
    world = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    out: dict = {"notes": [], "faults": {}}
    step = f"{os.environ.get('SLURM_JOB_ID', '0')}.{os.environ.get('SLURM_STEP_ID', '0')}"
    address = RunDir(job_env.run_dir_from_env()).allreduce_address(job_env.attempt_from_env(), step)
    delta = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(node, 0, world, is_master=True, timeout=delta, wait_for_workers=False)
        tmp = address.with_name(address.name + ".tmp")
        tmp.write_text(f"{node} {store.port}\n")
        tmp.replace(address)
    else:
        found = wait_for_address(address, deadline)
        if found is None:
            host = node_of(0, step_hosts())
            out["faults"][host] = f"did not host the node check's all-reduce within {timeout_s:.0f}s (seen from {node})"
            return out
        store = dist.TCPStore(found[0], found[1], world, is_master=False, timeout=delta)
    store.set(f"joined/{rank}", node)
    if rank == 0:
        missing = wait_keys(store, [f"joined/{r}" for r in range(1, world)], deadline)
        if missing:
            hosts = step_hosts()
            for key in missing:
                out["faults"][node_of(int(key.split("/")[1]), hosts)] = (
                    f"did not join the node check's all-reduce within {timeout_s:.0f}s")
            store.set("verdict", "abort")
            return out
        store.set("verdict", "go")
    elif wait_keys(store, ["verdict"], deadline) or store.get("verdict") != b"go":
        out["notes"].append("all-reduce not run: a node of this step did not join (rank 0 names it)")
        return out
    wrong = all_reduce(store, rank, world, max(deadline - time.monotonic(), 5.0))
    if wrong:
        out["notes"].append(f"{wrong}: every node joined, so no one node is named")
    else:
        backend = "nccl" if torch.cuda.is_available() and not job_env.trainer_on_cpu() else "gloo"
        out["notes"].append(f"all-reduce over {world} node(s) ok ({backend}, {time.monotonic() - start:.1f}s)")
    if rank == 0:
        address.unlink(missing_ok=True)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmrl.runtime.steps.probe_allreduce")
    parser.add_argument("--timeout", type=float, default=DEADLINE_S)
    args = parser.parse_args(argv)
    if torch is None:
        print(json.dumps({"notes": [f"all-reduce skipped: torch cannot be imported here ({NO_TORCH})"], "faults": {}}))
        return NO_TORCH_EXIT
    began = time.monotonic()
    try:
        out = run(args.timeout)
    except Exception as e:  # noqa: BLE001 - the probe's own trouble is reported, never the job's failure
        out = {"notes": [f"all-reduce could not run: {type(e).__name__}: {' '.join(str(e).split())[:300]}"],
               "faults": {}}
    out["seconds"] = round(time.monotonic() - began, 2)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
