"""A step's rollouts as the trainer's batch: group-relative advantages, the typed samples
(``slurmrl.contract.rollouts``), written to ``rollouts/step-NNNNNN.json`` under a temporary name and renamed."""

from __future__ import annotations

import statistics
from pathlib import Path

from slurmrl.contract.rollouts import RolloutBatch, Sample
from slurmrl.runtime import step_files


def advantages(rewards: list[float], by_std: bool = True) -> list[float]:
    """Group-relative: reward minus the group mean, over the group std when ``by_std`` (GRPO; 0 when all
    equal), else not divided (Dr. GRPO: a group of nearly equal rewards does not get large advantages)."""
    mean = statistics.fmean(rewards)
    if not by_std:
        return [r - mean for r in rewards]
    std = statistics.pstdev(rewards)
    return [(r - mean) / (std + 1e-4) if std > 1e-8 else 0.0 for r in rewards]


def sample_of(rollout: dict, reward: float, advantage: float) -> Sample:
    """A sampler's rollout (a text completion or a conversation) as the trainer's sample."""
    mask = rollout.get("completion_mask")
    return Sample(prompt_ids=tuple(rollout["prompt_ids"]), completion_ids=tuple(rollout["completion_ids"]),
                  logprobs=tuple(rollout["logprobs"]), routed_experts=rollout.get("routed_experts") or None,
                  completion_mask=None if mask is None else tuple(mask), reward=float(reward), advantage=advantage)


def scored(groups: list[list[dict]], rewards: list[float], by_std: bool = True) -> list[Sample]:
    """Every group's rollouts with their rewards (``rewards`` flat, in the groups' order) and advantages
    (``advantages``)."""
    scores = iter(rewards)
    samples = []
    for group in groups:
        rs = [next(scores) for _ in group]
        samples += [sample_of(g, r, a) for g, r, a in zip(group, rs, advantages(rs, by_std))]
    return samples


def write(run_dir: Path, batch: RolloutBatch) -> Path:
    """The batch at ``rollouts/step-NNNNNN.json`` (renamed into place: a reader never sees half of it)."""
    path = step_files.rollout_path(run_dir, batch.step)
    step_files.write_json_atomic(path, batch.to_json())
    return path
