"""Edits a user makes to a rendered job.sbatch, shared by the cluster tests."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VLLM_COMMAND = re.compile(r"(-- \\\n)\s+\S+ -m vllm\.entrypoints\.openai\.api_server \\\n(?:\s+--.*\\\n)*\s+--.*\n")


def serve_with_ok_server(script: str) -> str:
    """The vLLM command line, as rendered, becomes tests/support/ok_server.py (a test double answering 200
    on every path) on the same port: for tests about the script's mechanics, not the engine."""
    text, n = VLLM_COMMAND.subn(rf'\1        {sys.executable} {ROOT}/tests/support/ok_server.py "${{port}}"\n', script)
    assert n == 1, "no vLLM command line in the script"
    return text
