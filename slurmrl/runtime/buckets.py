"""Cutting a list of sizes into buckets (the trainer's weight publish and the gloo weight transfer)."""

from __future__ import annotations


def buckets(sizes: list[int], limit: int) -> list[range]:
    """Consecutive index ranges whose sizes add up to at most ``limit`` (a larger one alone)."""
    out, start, used = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and used + size > limit:
            out.append(range(start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out
