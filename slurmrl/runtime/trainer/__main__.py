"""``python -m slurmrl.runtime.trainer --config RUN_DIR/components/trainer.toml`` (one process per GPU,
under torchrun)."""

from __future__ import annotations

import argparse
import sys

from slurmrl.contract.weight_sync import Broadcast
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.step_files import latest
from slurmrl.runtime.trainer.ready import mark_ready
from slurmrl.settings.trainer import TrainerSettings, load


def finished(s: TrainerSettings) -> int | None:
    """The step of a complete checkpoint at or past max_steps, if any (checked before importing torch,
    so a job requeued after the trainer finished does not pay for loading it)."""
    step, _ = latest(RunDir(s.root).checkpoints, "DONE")
    return step if step and step >= s.max_steps else None


def main() -> int:
    ap = argparse.ArgumentParser(description="slurmrl trainer (SFT or RL), one process per GPU under torchrun")
    ap.add_argument("--config", required=True, help="RUN_DIR/components/trainer.toml")
    ap.add_argument("--weight-servers", nargs="+", action="append", default=[], metavar="RANKS URL",
                    help="trainer.weight_sync by broadcast, per server component: each server's worker processes, "
                    "then every server's URL (once per component)")
    ap.add_argument("--weight-master", metavar="HOST:PORT", help="where rank 0 hosts the transfer group")
    ap.add_argument("--weight-world-size", type=int, help="the transfer group's size: 1 + every server's workers")
    args = ap.parse_args()
    s = load(args.config)
    done = finished(s)
    if done is not None:
        print(f"slurmrl: trainer: checkpoint of step {done} is complete (max_steps {s.max_steps}): nothing to do",
              flush=True)
        mark_ready(s.root)
        return 0
    from slurmrl.runtime.trainer.loop import run  # torch, transformers

    return run(s, broadcast_target(s, args, ap))


def broadcast_target(s: TrainerSettings, args: argparse.Namespace, ap: argparse.ArgumentParser):
    """What ``--weight-*`` say (None for filesystem sync): the servers, their workers, the group."""
    sync = s.weight_sync
    if s.kind != "rl" or not isinstance(sync, Broadcast):
        return None
    from slurmrl.runtime.trainer.weight_sync import Target  # vllm

    if not args.weight_servers or not args.weight_master or not args.weight_world_size:
        ap.error(f"trainer.weight_sync = {sync.backend!r} needs --weight-servers, --weight-master and "
                 "--weight-world-size (the job script passes them)")
    urls, ranks = [], []
    for group in args.weight_servers:
        if not group[0].isdigit() or len(group) < 2:
            ap.error(f"--weight-servers {' '.join(group)}: give the workers per server, then the servers' URLs")
        urls += group[1:]
        ranks += [int(group[0])] * (len(group) - 1)
    host, _, port = args.weight_master.rpartition(":")
    if not host or not port.isdigit():
        ap.error(f"--weight-master {args.weight_master}: HOST:PORT")
    return Target(sync, urls, ranks, host, int(port), args.weight_world_size)


if __name__ == "__main__":
    sys.exit(main())
