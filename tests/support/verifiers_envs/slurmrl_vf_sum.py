"""A verifiers SingleTurnEnv written for slurmrl's tests (never a hub download): add two numbers.

Reward: 1 when the answer holds the sum, plus ``bonus`` (weight 2) always, so a test knows the reward
the rubric gives for a known answer; ``raise_on``: the example whose bonus function raises.
"""

import verifiers as vf
from datasets import Dataset

PAIRS = [(2, 3), (4, 4), (1, 6)]


def load_environment(bonus: float = 0.25, raise_on: int = -1) -> vf.Environment:
    rows = [{"question": f"What is {a} + {b}? Answer with the number only.", "answer": str(a + b)} for a, b in PAIRS]

    def correct(completion, answer) -> float:
        return 1.0 if answer in (completion[-1].content or "") else 0.0

    def bonus_points(state) -> float:
        if state["example_id"] == raise_on:
            raise ValueError("the rubric broke")
        return bonus

    rubric = vf.Rubric(funcs=[correct, bonus_points], weights=[1.0, 2.0])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="You add numbers.", rubric=rubric)
