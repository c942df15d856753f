"""A verifiers ToolEnv written for slurmrl's tests (never a hub download): an ``add`` tool and a
``divide`` tool whose ZeroDivisionError is a stop error (verifiers then raises out of env_response).

Reward: 1 when a tool message holds the answer (the model called ``add`` right), else 0.
"""

import random

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def load_environment(max_turns: int = 3, tasks: int = 1, seed: int = 0) -> vf.Environment:
    """Add 17 and 25 (``tasks`` > 1: that many sums of two numbers below 100, drawn with ``seed``); a
    few-shot example of the call (SmolLM2-135M copies it; asked in words only, it writes prose)."""
    rng = random.Random(seed)
    pairs = [(17, 25)] + [(rng.randrange(100), rng.randrange(100)) for _ in range(tasks - 1)]
    rows = [{"question": f"Add {a} and {b}.", "answer": str(a + b)} for a, b in pairs]
    example = [{"role": "user", "content": "Add 2 and 3."},
               {"role": "assistant", "content": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'}]

    def tool_said_answer(completion, answer) -> float:
        return float(any(m.role == "tool" and m.content == answer for m in completion))

    return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[add, divide], max_turns=max_turns,
                      stop_errors=[ZeroDivisionError], rubric=vf.Rubric(funcs=[tool_said_answer]),
                      system_prompt="You call tools by writing <tool_call> JSON </tool_call>.", few_shot=example)
