"""benchmarks/gpu_check.sh on a machine without CUDA: it runs to the first part that needs CUDA (the
versions, what torch has, every trainer module imported), says it stops there, and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # imports torch and transformers in a fresh interpreter
def test_the_device_script_runs_on_cpu_up_to_cuda(tmp_path):
    pytest.importorskip("torch")
    env = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "trainer modules import" in out and "grouped_mm: True" in out
    assert "no CUDA device: parts 2-7 need one; stopping here (exit 0)." in out
    assert "=== 2" not in out


@pytest.mark.slow  # two torch runs of a few seconds each
@pytest.mark.parametrize("argv", [
    ["trainer_bench.py", "--preset", "tiny-moe", "--mode", "rl", "--steps", "1", "--reference"],
    ["component_bench.py", "--preset", "tiny", "--steps", "2"],
    ["attention_bench.py", "--docs", "3", "--doc-len", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"],
])
def test_the_benches_the_device_script_runs_work_on_cpu(argv):
    """The benches behind parts 3-5 at their tiny presets, on CPU: a device session must not spend its
    minutes finding that a bench no longer reads what the trainer writes (it happened: the typed rollout
    batch left both indexing samples as dicts)."""
    pytest.importorskip("torch")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:]], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    if argv[0] == "attention_bench.py":
        assert "sdpa-math" in proc.stdout and "flex  skipped:" in proc.stdout  # CPU: no flex backward
        return
    assert "tok/s" in proc.stdout
    if argv[0] == "trainer_bench.py":
        assert "fast / reference:" in proc.stdout
    else:
        assert "median of steps" in proc.stdout
