"""Tools for chat environments: a tool that runs user code does it in a subprocess with a time limit.

``run_python(code, timeout_s)`` runs ``code`` in a fresh, isolated Python (``-I``: no user site, no
PYTHONPATH, no current directory on the path) with no stdin, and returns what it printed; past
``timeout_s`` the process is killed and ``ToolTimeout`` raised (the orchestrator then scores the
rollout 0 and counts it, as for any environment step that times out).
"""

from __future__ import annotations

import subprocess
import sys

OUTPUT_CHARS = 2000  # of a tool's output, into the conversation


class ToolTimeout(TimeoutError):
    """A tool ran past its time limit (its process was killed)."""


def run_python(code: str, timeout_s: float = 5.0) -> str:
    """Run ``code`` in a subprocess killed after ``timeout_s``; its stdout and stderr, cut to OUTPUT_CHARS."""
    try:
        done = subprocess.run([sys.executable, "-I", "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolTimeout(f"python ran past its {timeout_s:g} s limit") from None
    out = done.stdout + (f"\n{done.stderr}" if done.stderr else "")
    return out.strip()[:OUTPUT_CHARS]


PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
