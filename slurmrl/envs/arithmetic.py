"""Add two small numbers; reward 1 for the exact answer, else 0.

``few_shot``: solved examples before each question (``3+4=7`` lines), which lets a small
pretrained model (SmolLM2-135M answers about a third right with 2) start with some reward."""

from __future__ import annotations

import random
from typing import ClassVar, Literal

from slurmrl.envs.protocol import TextTask
from slurmrl.envs.text import answer_line


class Task(TextTask):
    target: str  # the sum, as text


class Arithmetic:
    kind: ClassVar[Literal["text"]] = "text"

    def __init__(self, max_operand: int = 9, few_shot: int = 0):
        if max_operand < 1 or few_shot < 0:
            raise ValueError("arithmetic needs max_operand >= 1 and few_shot >= 0")
        self.max_operand, self.few_shot = max_operand, few_shot

    def pair(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)

    def prompts(self, rng: random.Random, n: int) -> list[Task]:
        out: list[Task] = []
        for _ in range(n):
            shots = "".join(f"{x}+{y}={x + y}\n" for x, y in (self.pair(rng) for _ in range(self.few_shot)))
            a, b = self.pair(rng)
            out.append({"prompt": f"{shots}{a}+{b}=", "target": str(a + b)})
        return out

    def split_key(self, task: Task) -> str:
        """The question without its solved examples (slurmrl.envs.heldout): ``3+4=``."""
        return task["prompt"].rsplit("\n", 1)[-1]

    def reward(self, task: Task, completion: str) -> float:
        return 1.0 if answer_line(completion) == task["target"] else 0.0
