"""A checkpoint is complete or absent: how it becomes visible, and which one a resume loads.

``state.save_checkpoint`` writes a checkpoint under ``.step-NNNNNN.tmp`` (a dot name: globs for
``step-*`` never see it). Every rank writes its part and ``fsync``s it (``fsync_tree``), then tells
rank 0 so over a gloo group (``peers_synced``); rank 0 then writes the completion marker ``DONE``
inside the temporary folder and makes the whole of it visible with one rename to ``step-NNNNNN``.
A folder named ``step-*`` without ``DONE`` is never loaded.

When the trainer is asked to stop while a save is in progress (a peer failed and torchrun ends the
others, or the job is being stopped), the save goes on: rank 0 waits for its peers' parts up to
``slurm.grace_seconds`` after the stop (less a margin, to exit before the SIGKILL), or until a peer
is gone; a checkpoint that cannot be finished in that time is dropped whole (its temporary folder
removed), and the previous complete one stays the one to resume.

Which checkpoint to resume is decided by rank 0 alone and sent to the others
(``resume_point``): ranks on other nodes may see a shared directory's state through an attribute
cache (NFS, Lustre) and must not each decide from their own view. Rank 0 first removes what is
incomplete (temporaries, ``step-*`` folders without ``DONE``).
"""

from __future__ import annotations

import datetime
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from slurmrl.contract import job_env
from slurmrl.runtime.step_files import STEP_DIR, latest

MARKER = "DONE"
MARGIN_S = 2.0  # of the grace (at most a quarter of it), kept for the exit after a dropped save
WAIT_S = 1800.0  # the longest rank 0 waits for its peers' parts without a stop
PAUSE_ENV = job_env.TEST_CHECKPOINT_PAUSE  # test hook: seconds a rank sleeps after each file it writes


class Stop:
    """When the trainer was first asked to stop (monotonic seconds), for the grace of a save."""

    at: float | None = None

    @classmethod
    def note(cls) -> None:
        if cls.at is None:
            cls.at = time.monotonic()

    @classmethod
    def past(cls, grace_s: float) -> bool:
        return cls.at is not None and time.monotonic() > cls.at + grace_s - min(MARGIN_S, grace_s / 4)


class Dropped(RuntimeError):
    """A checkpoint that could not be finished in time: its temporary folder is gone."""


def test_pause() -> None:
    """Test hook (SLURMRL_TEST_CHECKPOINT_PAUSE_S): make a save slow enough for a test to kill it
    in the middle. Unset in every job slurmrl renders."""
    pause = float(os.environ.get(PAUSE_ENV) or 0)
    if pause > 0:
        time.sleep(pause)


def fsync_tree(root: Path, only: list[Path] | None = None) -> None:
    """``fsync`` the files ``only`` (or every file under ``root``), then ``root``'s folders."""
    files = only if only is not None else [p for p in root.rglob("*") if p.is_file()]
    for p in files:
        _fsync(p, os.O_RDONLY)
    if only is None:
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _fsync(d, os.O_RDONLY | os.O_DIRECTORY)
        _fsync(root, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def group(world: int):
    """A gloo group of every trainer rank for the save's confirmations (collective; None on one rank)."""
    if world == 1:
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=WAIT_S))


def peers_synced(grp, rank: int, world: int, grace_s: float | None, poll: float = 0.1) -> str | None:
    """After this rank's part is written and synced. Rank 0: None once every other rank says the
    same, else why not (a peer gone; not in time after a stop). Other ranks: tell rank 0, None."""
    if world == 1:
        return None
    if rank != 0:
        dist.send(torch.ones(1), dst=0, group=grp)
        return None
    heard: dict[int, str | None] = {}  # peer -> None (synced) or its error

    def listen() -> None:  # a blocking receive per peer, beside the wait below (gloo's work has no poll)
        for r in range(1, world):
            try:
                dist.recv(torch.zeros(1), src=r, group=grp)
                heard[r] = None
            except RuntimeError as e:  # the peer's process is gone
                heard[r] = f"rank {r} is gone ({str(e).splitlines()[0][:120]})"
                return

    listener = threading.Thread(target=listen, name="checkpoint-peers", daemon=True)
    listener.start()
    start = time.monotonic()
    while listener.is_alive():
        listener.join(poll)
        missing = [str(r) for r in range(1, world) if r not in heard]
        if not listener.is_alive() or not missing:
            break
        if grace_s is not None and Stop.past(grace_s):
            return f"rank(s) {', '.join(missing)} not done {grace_s:g}s (slurm.grace_seconds) after the stop"
        if time.monotonic() - start > WAIT_S:
            return f"rank(s) {', '.join(missing)} not done after {WAIT_S:.0f}s"
    return next((why for why in heard.values() if why), None)


def publish(tmp: Path, final: Path, step: int) -> None:
    """Rank 0, every part synced: ``DONE`` inside ``tmp``, then one rename makes it ``final``."""
    (tmp / MARKER).write_text(f"{step}\n")
    fsync_tree(tmp, [tmp / MARKER])
    _fsync(tmp, os.O_RDONLY | os.O_DIRECTORY)
    swap_in(tmp, final)
    _fsync(final.parent, os.O_RDONLY | os.O_DIRECTORY)


def swap_in(tmp: Path, final: Path) -> None:
    """``tmp`` becomes ``final`` by one rename."""
    if final.exists():  # left by an earlier attempt that got past this step without a checkpoint
        shutil.rmtree(final)
    tmp.rename(final)


def incomplete(root: Path) -> list[Path]:
    """Temporaries and ``step-*`` folders without ``DONE``: never loaded."""
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if (d.name.startswith(".step-") and d.name.endswith(".tmp"))
                  or (STEP_DIR.match(d.name) and not (d / MARKER).exists()))


def resume_point(root: Path, rank: int, world: int, log: Callable[[str], None] = print) -> tuple[int, Path | None]:
    """Collective: (step, folder) of the newest complete checkpoint under ``root`` as rank 0 sees it,
    on every rank ((0, None): none). Rank 0 removes the incomplete ones first."""
    choice: list = [0, None]
    if rank == 0:
        gone = incomplete(root)
        for d in gone:
            shutil.rmtree(d, ignore_errors=True)
        if gone:
            log(f"removed incomplete checkpoint(s) {', '.join(d.name for d in gone)} (no {MARKER}: never loaded)")
        step, path = latest(root, MARKER)
        choice = [step, None if path is None else path.name]
    if world > 1:
        dist.broadcast_object_list(choice, src=0)
    step, name = choice
    return step, None if name is None else root / name
