"""``python -m slurmrl.runtime.trainer --config RUN_DIR/components/trainer.toml`` (one process per GPU,
under torchrun)."""

from __future__ import annotations

import argparse
import sys

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
    s = load(ap.parse_args().config)
    done = finished(s)
    if done is not None:
        print(f"slurmrl: trainer: checkpoint of step {done} is complete (max_steps {s.max_steps}): nothing to do",
              flush=True)
        mark_ready(s.root)
        return 0
    from slurmrl.runtime.trainer.loop import run  # torch, transformers

    return run(s)


if __name__ == "__main__":
    sys.exit(main())
