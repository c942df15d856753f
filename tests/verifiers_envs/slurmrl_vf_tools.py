"""A verifiers ToolEnv written for slurmrl's tests (never a hub download): an ``add`` tool and a
``divide`` tool whose ZeroDivisionError is a stop error (verifiers then raises out of env_response).

Reward: 1 when a tool message holds the answer (the model called ``add`` right), else 0.
"""

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


def load_environment(max_turns: int = 3) -> vf.Environment:
    ask = ('Call the add tool to add 17 and 25. Write exactly: <tool_call>\n{"name": "add", "arguments": '
           '{"a": 17, "b": 25}}\n</tool_call>')
    rows = [{"question": ask, "answer": "42"}]

    def tool_said_answer(completion, answer) -> float:
        return float(any(m.role == "tool" and m.content == answer for m in completion))

    return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[add, divide], max_turns=max_turns,
                      stop_errors=[ZeroDivisionError], rubric=vf.Rubric(funcs=[tool_said_answer]))
