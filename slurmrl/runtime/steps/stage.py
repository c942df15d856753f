"""Copy the model's weights to this node once (``model.stage = "node-local"``).

    python -m slurmrl.runtime.steps.stage SRC STAGE_DIR KEY

Run by one task per node before the servers start. Copies the directory SRC to
STAGE_DIR/<this node's name>/KEY (``$SLURMD_NODENAME``, else the hostname), under an exclusive
``flock`` on STAGE_DIR/<node>/KEY.lock, so two jobs on one node copy once and the second waits.
A copy is a hit when its manifest (KEY/.slurmrl-stage.json) lists SRC's files with the sizes and
modification times SRC has now, and each local file has its size; otherwise the files are copied
to KEY.partial-<pid> with SHA-256 computed while reading SRC, read back and compared, and the
folder is renamed into place. One phase line per node says hit or miss, the size and the seconds
(waiting for the lock and copying), in logs/attempt-N/phases of the job's run dir.

Standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from slurmrl.contract import job_env
from slurmrl.contract.argv import Stage
from slurmrl.rundir.paths import RunDir

MANIFEST = ".slurmrl-stage.json"
CHUNK = 8 << 20


def listing(src: Path) -> dict[str, list[int]]:
    """relative path -> [size, mtime_ns] of every file under ``src`` (symlinks followed)."""
    out = {}
    for root, dirs, files in os.walk(src, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            p = Path(root) / name
            st = p.stat()
            out[p.relative_to(src).as_posix()] = [st.st_size, st.st_mtime_ns]
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def copy_file(src: Path, dst: Path) -> str:
    """Copy, returning the SHA-256 of what was read."""
    h = hashlib.sha256()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(CHUNK):
            h.update(chunk)
            fo.write(chunk)
    return h.hexdigest()


def is_hit(dest: Path, files: dict[str, list[int]]) -> bool:
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("source") != files:
        return False
    return all((dest / rel).is_file() and (dest / rel).stat().st_size == size for rel, (size, _) in files.items())


def stage(src: Path, dest: Path) -> tuple[bool, int, int, float]:
    """(hit, files, bytes, seconds copying) once ``dest`` holds a checked copy of ``src``."""
    files = listing(src)
    if not files:
        raise SystemExit(f"slurmrl: stage: {src} has no files")
    total = sum(size for size, _ in files.values())
    if is_hit(dest, files):
        return True, len(files), total, 0.0
    t0 = time.monotonic()
    tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    sums = {}
    for rel in files:
        sums[rel] = copy_file(src / rel, tmp / rel)
    for rel, digest in sums.items():  # read back what was written
        got = sha256_of(tmp / rel)
        if got != digest:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SystemExit(f"slurmrl: stage: {rel}: the copy's sha256 {got[:12]} differs from the source's "
                             f"{digest[:12]} (disk full or failing?)")
    (tmp / MANIFEST).write_text(json.dumps({"source_dir": str(src), "source": files, "sha256": sums}, indent=1))
    old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return False, len(files), total, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    a = Stage.parse(sys.argv[1:] if argv is None else argv, description=__doc__.splitlines()[0])
    src, stage_dir, key = Path(a.src), Path(a.stage_dir), a.key
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if not src.is_dir():
        print(f"slurmrl: stage: model.path {src} is not a directory on {node}", file=sys.stderr)
        return 1
    dest = stage_dir / node / key
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(dest.with_name(f"{key}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = time.monotonic() - t0
        hit, n, total, took = stage(src, dest)
    what = (f"model staged on {node}: cache {'hit' if hit else 'miss'}, {n} file(s), {total / 1e6:.1f} MB "
            f"{'already in' if hit else 'copied to'} {dest}" + ("" if hit else f" in {took:.1f}s, sha256 checked")
            + f" (waited {waited:.1f}s for the lock)")
    print(f"slurmrl: {what}", flush=True)
    if job_env.in_job():
        RunDir.from_env().add_phase(RunDir.attempt_from_env(), what)
    return 0


if __name__ == "__main__":
    sys.exit(main())
