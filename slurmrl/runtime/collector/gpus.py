"""The GPUs of the collector's node, as Prometheus-style samples, where ``nvidia-smi`` exists
(nothing, quietly, where it does not or fails)."""

from __future__ import annotations

import shutil
import subprocess

QUERY = "index,utilization.gpu,memory.used,memory.total"
NAMES = ("gpu_utilization_percent", "gpu_memory_used_mib", "gpu_memory_total_mib")


def available() -> bool:
    return shutil.which("nvidia-smi") is not None


def parse(text: str) -> dict[str, float]:
    """``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` output -> samples."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        words = [w.strip() for w in line.split(",")]
        if len(words) != 1 + len(NAMES) or not words[0].isdigit():
            continue
        for name, word in zip(NAMES, words[1:]):
            try:
                out[f'{name}{{gpu="{words[0]}"}}'] = float(word)
            except ValueError:  # "[N/A]" on some boards
                pass
    return out


def sample(timeout: float = 5.0) -> dict[str, float]:
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse(r.stdout) if r.returncode == 0 else {}
