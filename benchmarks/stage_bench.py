"""What does node-local staging cost (model.stage = "node-local")? Prints figures; asserts nothing.

Runs slurmrl.runtime.steps.stage's copy on this machine, outside Slurm: a synthetic model folder of
SHARDS safetensors-sized files (random bytes) is staged into a fresh folder (a miss: copy with
SHA-256 while reading, read back and compare, rename) and then again (a hit: the manifest and
sizes checked), against a plain ``shutil.copytree`` of the same folder. The page cache makes the
second read of each file cheap here, as it would be on a node right after the copy; a first read
from a cold shared filesystem is what the node-local copy saves the servers' later starts.

    .venv/bin/python benchmarks/stage_bench.py [--mb 512 --shards 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from slurmrl.runtime.steps.stage import stage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512, help="total size of the model folder, MB")
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stage-bench-") as tmp:
        src = Path(tmp) / "model"
        src.mkdir()
        per = args.mb * 10**6 // args.shards
        for i in range(args.shards):
            with open(src / f"model-{i:05d}-of-{args.shards:05d}.safetensors", "wb") as f:
                left = per
                while left:
                    n = min(left, 8 << 20)
                    f.write(os.urandom(n))
                    left -= n
        (src / "config.json").write_text("{}")
        t0 = time.monotonic()
        shutil.copytree(src, Path(tmp) / "plain")
        plain = time.monotonic() - t0
        dest = Path(tmp) / "stage" / "node" / "model-key"
        dest.parent.mkdir(parents=True)
        t0 = time.monotonic()
        hit, n, total, _ = stage(src, dest)
        miss_s = time.monotonic() - t0
        assert not hit
        t0 = time.monotonic()
        hit2, *_ = stage(src, dest)
        hit_s = time.monotonic() - t0
        mb = total / 1e6
        print(f"model folder: {n} files, {mb:.0f} MB (tmpfs or disk under {tempfile.gettempdir()})")
        print(f"plain copytree:          {plain:6.2f} s  {mb / plain:7.0f} MB/s")
        print(f"stage, miss (sha256, read back): {miss_s:6.2f} s  {mb / miss_s:7.0f} MB/s  "
              f"({miss_s / plain:.1f}x the plain copy)")
        print(f"stage, hit (manifest + sizes):   {hit_s:6.3f} s  (hit={hit2})")


if __name__ == "__main__":
    main()
