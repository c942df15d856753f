"""What the built-in environments read from a completion."""

from __future__ import annotations


def answer_line(completion: str) -> str:
    """What a completion answers: its text up to the first line break."""
    return completion.split("\n", 1)[0].strip()
