"""Waiting for a condition with a deadline: the one polling loop the tests share. A test never reads a
daemon's state once and never waits without end (a flaky test blocks every landing)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], what: str = "a condition", timeout: float = 60, poll: float = 0.5,
             detail: Callable[[], str] = lambda: "") -> Any:
    """``predicate()``'s first true value, asked every ``poll`` seconds; an AssertionError naming ``what``
    (and ``detail()``, when it says something) once ``timeout`` seconds have passed without one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    extra = detail()
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}" + (f"\n{extra}" if extra else ""))
