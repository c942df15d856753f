"""Guess a whole number: after each guess the environment answers "Higher." or "Lower." (a chat
environment, ``slurmrl.envs.chat``: several model turns with feedback between them).

Reward: 1 when a guess hits the number; otherwise partial credit for the closest guess in range,
``0.5 * (1 - distance / (high - low))``, and 0 for a conversation without a number in range. The
partial credit makes the reward dense enough that a small model's rises within a few steps: first it
learns to answer with a number alone, then to follow the feedback.
"""

from __future__ import annotations

import random
import re
from typing import ClassVar, Literal

from slurmrl.envs.chat import answers
from slurmrl.envs.protocol import ChatTask, Message

NUMBER = re.compile(r"-?\d+")


class Task(ChatTask):
    secret: int  # the number to guess


def guess(text: str) -> int | None:
    """The first whole number in ``text``, or None."""
    m = NUMBER.search(text)
    return int(m.group()) if m else None


class GuessNumber:
    kind: ClassVar[Literal["chat"]] = "chat"

    def __init__(self, low: int = 1, high: int = 10):
        if high <= low:
            raise ValueError("guess_number needs high > low")
        self.low, self.high = low, high

    def prompts(self, rng: random.Random, n: int) -> list[Task]:
        ask = f"Guess my number from {self.low} to {self.high}. Reply with just one number."
        return [{"messages": [{"role": "user", "content": ask}], "secret": rng.randint(self.low, self.high)}
                for _ in range(n)]

    def respond(self, task: Task, messages: list[Message]) -> list[Message]:
        g = guess(answers(messages)[-1])
        if g == task["secret"]:
            return []  # found: the conversation ends
        if g is None or not self.low <= g <= self.high:
            said = f"Answer with a number from {self.low} to {self.high}."
        else:
            said = "Higher." if task["secret"] > g else "Lower."
        return [{"role": "user", "content": said}]

    def reward(self, task: Task, messages: list[Message]) -> float:
        guesses = [g for g in map(guess, answers(messages)) if g is not None and self.low <= g <= self.high]
        if not guesses:
            return 0.0
        if task["secret"] in guesses:
            return 1.0
        closest = min(abs(g - task["secret"]) for g in guesses)
        return 0.5 * (1 - closest / (self.high - self.low))
