"""How a step's rollouts are generated and scored, picked once as the orchestrator starts (``pick``, the only
place that asks what kind of environment it trains on, by the kind the environment declares): a text environment's (``rollout_text``) or a chat
environment's (``rollout_chat``: multi-turn conversations, scored as they end)."""

from __future__ import annotations

from typing import Protocol

from slurmrl.contract.metrics import EnvStats
from slurmrl.envs.protocol import Environment
from slurmrl.runtime.orchestrator.rollout_chat import ChatRollouts, ChatSampler
from slurmrl.runtime.orchestrator.rollout_text import Sampler, TextRollouts


class RolloutStyle(Protocol):
    def generate(self, tasks: list[dict], step: int) -> list[list[dict]]:
        """Every task's group of rollouts for training step ``step``."""

    def score(self, tasks: list[dict], groups: list[list[dict]]) -> list[float]:
        """Every rollout's reward, flat in the groups' order."""

    def stats(self) -> EnvStats | None:
        """The environment's figures since the last call (None: a text environment has none)."""


def pick(env: Environment, sampler: Sampler, chat: ChatSampler) -> RolloutStyle:
    """The rollouts of ``env`` (the training view of the job's environment), by its declared kind."""
    return ChatRollouts(chat) if env.chat else TextRollouts(sampler, env)
