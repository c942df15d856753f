"""One trainer rank for tests/test_checkpoint_commit.py, run by ``torchrun --nproc-per-node=N``:

``save MODEL ROOT STEPS GRACE PAUSE PAUSE_RANKS STOP [STAGE]``: the model made ready as the trainer makes
it (FSDP2 over gloo), then per step in STEPS (comma-separated) one optimizer step and one checkpoint
through ``state.save_checkpoint``. Before the last one the test hook SLURMRL_TEST_CHECKPOINT_PAUSE_S
is set to PAUSE on the ranks PAUSE_RANKS (comma-separated) and, with STOP=1, a stop is noted (as the
trainer's SIGTERM handler does), so that save has GRACE seconds. A dropped save: exit 3. With STAGE
(trainer.checkpoint_stage_dir) each save is staged there and copied in the background: the pause is
set once the last save has returned, so it slows the background copy, not the node-local write.

``resume ROOT VIEW OUT``: ``commit.resume_point`` with rank 0 reading ROOT and every other rank
VIEW (a stale view of the folder); each rank writes its answer to OUT/choice-rank<R>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["SLURMRL_TRAINER_DEVICE"] = "cpu"

import torch  # noqa: E402

from slurmrl.runtime.trainer import commit, numerics, state  # noqa: E402
from slurmrl.runtime.trainer.loop import Dist, load_model  # noqa: E402
from slurmrl.runtime.trainer.stage import Stager  # noqa: E402


def save(model_dir: Path, root: Path, steps: list[int], grace: float, pause: str, pause_ranks: set[int],
         stop: bool, stage: str = "") -> int:
    torch.manual_seed(0)
    d = Dist("float32")
    model, _ = load_model(str(model_dir), d, False)
    optim = numerics.optimizer(list(model.parameters()), 1e-2, 0.0, False)
    grp = commit.group(d.world)
    stager = Stager(stage, root, d.rank) if stage else None
    try:
        for step in steps:
            model(input_ids=torch.randint(0, 50, (1, 16))).logits.float().pow(2).mean().backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            last = step == steps[-1]
            if last and d.rank in pause_ranks and stager is None:
                os.environ[commit.PAUSE_ENV] = pause
            if last and stop:
                commit.Stop.note()
            state.save_checkpoint(root, step, model, optim, model.config, None, model_dir, None, {"seed": 0}, 5,
                                  d.rank, group=grp, grace_s=grace, stage=stager)
            if last and d.rank in pause_ranks and stager is not None:
                os.environ[commit.PAUSE_ENV] = pause
            print(f"rank {d.rank}: saved step {step}", flush=True)
        if stager is not None:
            stager.wait(lambda msg: print(f"rank {d.rank}: {msg}", flush=True))
    except commit.Dropped as e:
        print(f"rank {d.rank}: {e}", flush=True)
        return 3
    return 0


def resume(root: Path, view: Path, out: Path) -> int:
    d = Dist("float32")
    step, path = commit.resume_point(root if d.rank == 0 else view, d.rank, d.world)
    (out / f"choice-rank{d.rank}.json").write_text(json.dumps({"step": step, "name": path.name if path else None}))
    return 0


def main() -> int:
    try:
        if sys.argv[1] == "save":
            model_dir, root, steps, grace, pause, ranks, stop = sys.argv[2:9]
            return save(Path(model_dir), Path(root), [int(s) for s in steps.split(",")], float(grace), pause,
                        {int(r) for r in ranks.split(",") if r}, stop == "1", sys.argv[9] if len(sys.argv) > 9 else "")
        return resume(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    finally:  # as the trainer ends (loop.run): a rank that exits with its gloo group open can abort its peer
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
