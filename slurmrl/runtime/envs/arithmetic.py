"""Add two small numbers; reward 1 for the exact answer, else 0."""

from __future__ import annotations

import random


class Arithmetic:
    def __init__(self, max_operand: int = 9):
        self.max_operand = max_operand

    def prompts(self, rng: random.Random, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            out.append({"prompt": f"{a}+{b}=", "target": str(a + b)})
        return out

    def reward(self, task: dict, completion: str) -> float:
        from slurmrl.runtime.envs import answer_line

        return 1.0 if answer_line(completion) == task["target"] else 0.0
