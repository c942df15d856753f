"""The held-out split of an environment: tasks that training never samples and evaluation does.

Which tasks are held out is decided by a hash of each task's key (``split_key(task)`` when the
environment has that method, else its prompt; a chat task, which has ``messages`` in place of a
prompt, is keyed on the whole task: its messages and what else the environment keeps in it, such as
``guess_number``'s secret), so the split is the same in every run, on every
machine and for every seed, and needs no list of the task space: a task is held out when the hash
of its key falls in the first ``fraction`` of the range. Training draws through ``TrainSplit``,
which drops held-out tasks and draws again; evaluation takes ``heldout_tasks``, distinct held-out
tasks drawn with a fixed seed, the same set at every evaluation.
"""

from __future__ import annotations

import hashlib
import random

from slurmrl.envs.protocol import Environment

DRAW_ROUNDS = 200  # draws of a batch before giving up on finding enough tasks on one side of the split


def task_key(env, task: dict) -> str:
    """What identifies ``task`` for the split: the environment's ``split_key``, the prompt, or (a chat task,
    without a prompt) the whole task."""
    return Environment.of(env).split_key(task)


def is_heldout(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(b"slurmrl-heldout\0" + key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


class TrainSplit(Environment):
    """``env`` without its held-out tasks: ``prompts`` draws until it has ``n`` training tasks; every
    other method (``reward``, ``rewards``, the hooks) is the environment's own."""

    def __init__(self, env, fraction: float):
        self.env = Environment.of(env)
        super().__init__(self.env.obj, self.env.name)
        self.fraction = fraction

    def prompts(self, rng: random.Random, n: int) -> list[dict]:
        out: list[dict] = []
        for _ in range(DRAW_ROUNDS):
            out += [t for t in self.env.prompts(rng, n - len(out)) if not is_heldout(self.split_key(t), self.fraction)]
            if len(out) >= n:
                return out[:n]
        raise SystemExit(f"slurmrl: environment {self.label}: {DRAW_ROUNDS} draws gave only {len(out)} of "
                         f"{n} training tasks outside the held-out split (eval.heldout_fraction = {self.fraction}): "
                         "its tasks all look alike to the split; give eval.environment instead")


def heldout_tasks(env, n: int, fraction: float, seed: int) -> list[dict]:
    """Up to ``n`` distinct held-out tasks of ``env``, the same for the same arguments; fewer when the
    environment has fewer (a small task space). SystemExit when it gives none."""
    env = Environment.of(env)
    rng, found, keys = random.Random(seed), [], set()
    batch = max(n, 64)
    for _ in range(DRAW_ROUNDS):
        for t in env.prompts(rng, batch):
            k = env.split_key(t)
            if k not in keys and is_heldout(k, fraction):
                keys.add(k)
                found.append(t)
                if len(found) == n:
                    return found
    if not found:
        raise SystemExit(f"slurmrl: environment {env.label}: no task of {DRAW_ROUNDS * batch} drawn falls in "
                         f"the held-out split (eval.heldout_fraction = {fraction}); raise it, or give eval.environment")
    return found
