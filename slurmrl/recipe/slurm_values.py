"""Slurm's own spellings of the values slurmrl writes on #SBATCH lines."""

from __future__ import annotations


def time_seconds(text: str) -> int:
    """Seconds in a Slurm time: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
    else:
        h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec
