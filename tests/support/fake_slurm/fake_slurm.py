#!/usr/bin/env python3
"""TEST DOUBLE, not Slurm: stands in for sbatch, scontrol, squeue, sacct and scancel (linked under
those names in a PATH-prepended folder) so the quick tier can check what slurmrl submits without a
cluster. Every call is appended to $FAKE_SLURM_LOG as one JSON line: [command, arg, ...].

sbatch prints job ids 1001, 1002, ...; with FAKE_SBATCH_FAIL=N the call after N successful ones
fails as Slurm does (exit 1, "sbatch: error: ..."). scontrol describes one partition, "debug"
(the default), of FAKE_SLURM_NODES nodes (default 4) with 8 GPUs and 64 CPUs each.
squeue and sacct know no job."""

import json
import os
import sys
from pathlib import Path

cmd = Path(sys.argv[0]).name
args = sys.argv[1:]
log = Path(os.environ["FAKE_SLURM_LOG"])
if args not in (["--help"], ["--version"]):
    with log.open("a") as f:
        f.write(json.dumps([cmd, *args]) + "\n")

if cmd == "sbatch":
    if args == ["--version"]:
        print("slurm 22.05.8")
    elif args == ["--help"]:
        print("Usage: sbatch [OPTIONS...] executable [args...]\n  --parsable\n  --dependency\n  --array")
    else:
        done = sum(1 for line in log.read_text().splitlines() if json.loads(line)[0] == "sbatch") - 1
        limit = os.environ.get("FAKE_SBATCH_FAIL")
        if limit is not None and done >= int(limit):
            print("sbatch: error: Batch job submission failed: Requested node configuration is not available",
                  file=sys.stderr)
            sys.exit(1)
        print(1001 + done)
elif cmd == "scontrol" and args[:2] == ["show", "node"]:
    for i in range(int(os.environ.get("FAKE_SLURM_NODES", "4"))):
        print(f"NodeName=n{i} CPUTot=64 Gres=gpu:8 State=IDLE Partitions=debug")
elif cmd == "scontrol" and args[:2] == ["show", "partition"]:
    print("PartitionName=debug Default=YES State=UP")
