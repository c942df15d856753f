"""``python -m slurmrl.runtime.trainer --config RUN_DIR/components/trainer.toml``"""

from __future__ import annotations

import sys

from slurmrl.runtime import component as rt
from slurmrl.runtime.steps import latest


def finished(comp: rt.Component) -> int | None:
    """The step of a complete checkpoint at or past max_steps, if any (checked before importing torch,
    so a job requeued after the trainer finished does not pay for loading it)."""
    step, _ = latest(comp.run_dir / "checkpoints", "DONE")
    return step if step and step >= int(comp.settings["max_steps"]) else None


def main() -> int:
    args = rt.config_arg("slurmrl trainer (SFT or RL), one process per GPU under torchrun")
    comp = rt.load(args.config)
    done = finished(comp)
    if done is not None:
        print(f"slurmrl: trainer: checkpoint of step {done} is complete (max_steps {comp.settings['max_steps']}): "
              "nothing to do", flush=True)
        rt.mark_ready(comp, "trainer finished")
        return 0
    rt.narrow_gpus(comp)  # before anything initialises CUDA
    from slurmrl.runtime.trainer.loop import run  # torch, transformers

    return run(comp)


if __name__ == "__main__":
    sys.exit(main())
