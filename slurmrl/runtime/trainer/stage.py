"""Node-local checkpoint staging (``trainer.checkpoint_stage_dir``): a save costs the training loop only
the write to a fast local disk; the copy to the run dir's shared ``checkpoints/`` runs in the background.

Each rank writes its part of step N's checkpoint (rank 0: model, optimizer, state.json; every rank: its
rng file) to ``STAGE_DIR/<run key>/rank-<R>/.step-N.tmp`` and returns to training. A thread per rank
then copies that part into the shared ``checkpoints/.step-N.tmp`` (which rank 0 created before the
write), ``fsync``s it and confirms to rank 0 over the save's own gloo group; rank 0 writes ``DONE`` and
makes the folder visible by the one rename of slurmrl.runtime.trainer.commit, as an unstaged save
does. So a kill at any moment of the copy leaves ``.step-N.tmp`` without ``DONE``: never loaded, removed
at the next start, and the previous complete checkpoint is the one resumed.

One copy is in flight at a time: the next save, and the end of training, wait for it. After a stop the
copy has ``slurm.grace_seconds`` (checked between chunks, and by rank 0's wait for its peers); one that
cannot finish in that time is dropped whole (``commit.Dropped``). The staged part is removed once copied.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurmrl.runtime.trainer import commit

CHUNK = 64 << 20  # bytes copied between two looks at the stop's grace


class Stager:
    """This rank's staging folder and the background copy in flight."""

    def __init__(self, stage_dir: str | Path, run_dir: Path, rank: int):
        key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
        self.root = Path(stage_dir) / f"run-{key}" / f"rank-{rank}"
        shutil.rmtree(self.root, ignore_errors=True)  # an earlier attempt's part, never copied
        self.thread: threading.Thread | None = None
        self.failed: BaseException | None = None
        self.what = ""

    def folder(self, name: str) -> Path:
        """An empty staging folder for one checkpoint's part (after the copy in flight is done)."""
        self.wait()
        d = self.root / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def start(self, what: str, copy: Callable[[], None]) -> None:
        def run() -> None:
            try:
                copy()
            except BaseException as e:  # noqa: BLE001 - raised again on the trainer's own thread by wait()
                self.failed = e

        self.what, self.failed = what, None
        self.thread = threading.Thread(target=run, name="checkpoint-stage", daemon=True)
        self.thread.start()

    def wait(self, log: Callable[[str], None] | None = None) -> None:
        """Until the copy in flight is done; raises what it raised (``commit.Dropped``: dropped whole)."""
        if self.thread is None:
            return
        t = time.perf_counter()
        self.thread.join()
        self.thread = None
        if self.failed is not None:
            raise self.failed
        if log is not None:
            log(f"{self.what} copied from the node-local stage (waited {time.perf_counter() - t:.2f}s)")


def copy_part(src: Path, dest: Path, grace_s: float | None) -> list[Path]:
    """Copy every file under ``src`` to the same place under ``dest`` (in chunks: after a stop, past the
    grace, ``commit.Dropped``); the files written."""
    written = []
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        target = dest / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(f, "rb") as a, open(target, "wb") as b:
            while chunk := a.read(CHUNK):
                if grace_s is not None and commit.Stop.past(grace_s):
                    raise commit.Dropped(f"the copy from the node-local stage not done {grace_s:g}s "
                                         "(slurm.grace_seconds) after the stop")
                b.write(chunk)
        written.append(target)
        commit.test_pause()
    return written
