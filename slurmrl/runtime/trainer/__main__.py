"""``python -m slurmrl.runtime.trainer --config RUN_DIR/components/trainer.toml`` (one process per GPU,
under torchrun)."""

from __future__ import annotations

import sys

from slurmrl.contract.programs import TrainerArgs
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
    args = TrainerArgs.parse(sys.argv[1:])
    s = load(args.config)
    done = finished(s)
    if done is not None:
        print(f"slurmrl: trainer: checkpoint of step {done} is complete (max_steps {s.max_steps}): nothing to do",
              flush=True)
        mark_ready(s.root)
        return 0
    from slurmrl.runtime.trainer.loop import run  # torch, transformers

    return run(s, broadcast_target(s, args))


def broadcast_target(s: TrainerSettings, args: TrainerArgs[str]):
    """What ``--weight-*`` say (None for filesystem sync): the servers, their workers, the group."""
    sync = s.weight_sync
    if s.kind != "rl" or not isinstance(sync, Broadcast):
        return None
    from slurmrl.runtime.trainer.weight_sync import Target  # vllm

    if not args.weight_servers or not args.weight_master or not args.weight_world_size:
        TrainerArgs.parser().error(f"trainer.weight_sync = {sync.backend!r} needs --weight-servers, --weight-master "
                                   "and --weight-world-size (the job script passes them)")
    urls = [url for group in args.weight_servers for url in group.urls]
    ranks = [group.ranks for group in args.weight_servers for _ in group.urls]
    host, port = args.master
    run_dir = RunDir(s.root)
    return Target(sync, urls, ranks, host, port, args.weight_world_size, run_dir.live_set, run_dir.synced)


if __name__ == "__main__":
    sys.exit(main())
