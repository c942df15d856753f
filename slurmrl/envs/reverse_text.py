"""Reverse a short string; reward is the similarity of the answer to the reversed string.

Partial credit (difflib ratio) makes the reward dense, so even a small model's reward climbs
within a few steps: first it learns to answer with letters of the alphabet, then the order.
"""

from __future__ import annotations

import difflib
import random
from typing import ClassVar, Literal

from slurmrl.envs.protocol import TextTask
from slurmrl.envs.text import answer_line


class Task(TextTask):
    target: str  # the reversed string


class ReverseText:
    kind: ClassVar[Literal["text"]] = "text"

    def __init__(self, alphabet: str = "abc", min_len: int = 2, max_len: int = 3):
        self.alphabet, self.min_len, self.max_len = alphabet, min_len, max_len

    def prompts(self, rng: random.Random, n: int) -> list[Task]:
        out: list[Task] = []
        for _ in range(n):
            word = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
            out.append({"prompt": f"reverse {word}:", "target": word[::-1]})
        return out

    def reward(self, task: Task, completion: str) -> float:
        return difflib.SequenceMatcher(None, answer_line(completion), task["target"]).ratio()
