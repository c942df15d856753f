"""Checks on text read back from a run dir before it goes anywhere a line break would matter
(a ``#`` comment or a line of job.sbatch, a Slurm option)."""

from __future__ import annotations


def is_one_line(text: str) -> bool:
    """No line break of any kind Python or a shell knows (\\n, \\r, \\v, \\f, \\x1c-\\x1e, \\x85,
    \\u2028, \\u2029) and no NUL."""
    return "\0" not in text and text.splitlines() in ([text], [])
