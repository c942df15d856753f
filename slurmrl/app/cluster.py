"""``--cluster NAME``: run a verb's Slurm commands on a cluster of the clusters file, over ssh
(slurmrl.remote), or on this machine."""

from __future__ import annotations

import argparse
import contextlib

from slurmrl.remote import transport_for
from slurmrl.slurm import tools


@contextlib.contextmanager
def on_cluster(args: argparse.Namespace):
    """Slurm's commands inside this block go to ``args.cluster`` (default: where the target's last job went)."""
    target = next((getattr(args, a) for a in ("recipe", "target", "run_dir") if hasattr(args, a)), None)
    with tools.using(transport_for(getattr(args, "cluster", None), target)):
        yield
