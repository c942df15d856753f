"""Where a test's search for free loopback ports starts, by pytest-xdist worker.

Tests that look for a free block of ports take the first one that binds and use it seconds later;
two xdist workers searching the same range at once would take the same block. Each worker searches
the range starting from its own share of it (rotated, so every block is still tried); without
xdist the order is unchanged.
"""

from __future__ import annotations

import os


def worker_order(starts: range) -> list[int]:
    """``starts`` rotated to begin at this xdist worker's share (gw0 the first, gw1 the second, ...)."""
    order = list(starts)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    k = (index % count) * len(order) // count if count > 1 else 0
    return order[k:] + order[:k]
