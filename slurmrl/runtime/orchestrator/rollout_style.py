"""How a step's rollouts are generated and scored, picked once as the orchestrator starts (``pick``, the only
place that asks what kind of environment it trains on): a text environment's (``rollout_text``) or a chat
environment's (``rollout_chat``: multi-turn conversations, scored as they end)."""

from __future__ import annotations

import random
from typing import Protocol

from slurmrl.contract.metrics import EnvStats
from slurmrl.envs.chat import speaks_messages
from slurmrl.runtime.orchestrator.rollout_chat import ChatRollouts, ChatSampler
from slurmrl.runtime.orchestrator.rollout_text import Sampler, TextRollouts


class RolloutStyle(Protocol):
    def generate(self, tasks: list[dict], step: int) -> list[list[dict]]:
        """Every task's group of rollouts for training step ``step``."""

    def score(self, tasks: list[dict], groups: list[list[dict]]) -> list[float]:
        """Every rollout's reward, flat in the groups' order."""

    def stats(self) -> EnvStats | None:
        """The environment's figures since the last call (None: a text environment has none)."""


def is_chat(env, seed: int) -> bool:
    """The environment's tasks are conversations (``messages``), read from one task drawn with ``seed``."""
    return speaks_messages(env.prompts(random.Random(seed), 1))


def pick(env, seed: int, sampler: Sampler, chat: ChatSampler) -> RolloutStyle:
    """The rollouts of ``env`` (the training view of the job's environment)."""
    return ChatRollouts(chat) if is_chat(env, seed) else TextRollouts(sampler, env)
